"""One self-contained HTML page of a study: provenance, a table of every setting's metrics, line
plots, phase diagrams and comparison pictures.

Inputs are results files of `nph sweep` (.jsonl, .csv), `nph retrieve --csv` rows, and JSON Lines
of `nph retrieve --json` or `nph batch` (one object with `config` and `metrics` per setting);
comparison pictures are `--save-grid` images. The page needs nothing else: figures are inline
PNG (base64), the style sheet is inline (with a print style), and it has no script, font or
link to load, so it opens offline, in a mail attachment, or printed.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.presentation.plot_data import METRIC_LABELS, is_setting, short

# table columns: metric → True when larger is better
METRICS = {
    "success": True,
    "sse": False,
    "mse": False,
    "cosine": True,
    "pixel_success": True,
    "support": False,
    "us_per_query": False,
}
PROVENANCE = ("nph_version", "dataset", "normalize", "sweep_seed", "seed", "run_seed", "device")
PROVENANCE += ("dtype", "memory", "M", "d", "Q")
AXES = ("beta", "noise", "mask", "M", "k", "alpha")  # phase-diagram axes, in order of preference
STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 72rem; margin: 1.5rem auto;
       padding: 0 1rem; color: #111; background: #fff; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85rem; margin: 0.5rem 0; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.45rem; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.best { font-weight: bold; background: #e3f4e1; }
.scroll { overflow-x: auto; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption, .note { font-size: 0.85rem; color: #444; }
code { font-size: 0.85rem; }
@media print {
  body { max-width: none; margin: 0; font-size: 10pt; }
  .scroll { overflow: visible; }
  figure, tr { break-inside: avoid; }
  td.best { background: none; text-decoration: underline; }
}
"""


def setting_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]], list[str]]:
    """(header, one row per setting: its name then metric means over trials, metric columns).
    Trials of one setting (rows that differ only in trial columns) are averaged."""
    settings = [c for c in dict.fromkeys(c for row in rows for c in row) if is_setting(c)]
    varying = [c for c in settings if len({short(row.get(c)) for row in rows}) > 1]
    metrics = [m for m in METRICS if any(_value(row, m) is not None for row in rows)]
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(short(row.get(c)) for c in varying), []).append(row)
    body = []
    for key, members in groups.items():
        named = [f"{c}={v}" for c, v in zip(varying, key, strict=True) if v != "none"]
        means = []
        for metric in metrics:
            values = [v for v in (_value(row, metric) for row in members) if v is not None]
            means.append(sum(values) / len(values) if values else None)
        body.append([" ".join(named) or "all rows", len(members), *means])
    return ["setting", "rows", *metrics], body, metrics


def _value(row: dict[str, Any], metric: str) -> float | None:
    value = row.get(f"{metric}_mean", row.get(metric))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def figures(rows: list[dict[str, Any]], grids: list[Path]) -> tuple[list, list[str]]:
    """([(caption, PNG bytes)] of the line plots, the phase diagram the rows allow, and the
    comparison pictures given; [why a plot was left out])."""
    from nphcli.presentation.plot import plot_phase, plot_results

    settings = {c for row in rows for c in row if is_setting(c)}
    varying = [c for c in AXES if c in settings and len({short(row.get(c)) for row in rows}) > 1]
    wanted = [(f"{m} against the first setting that varies", plot_results, m, {}) for m in METRICS]
    wanted = wanted[:2]  # success and sse
    if len(varying) >= 2:
        x, y = varying[:2]
        caption = f"phase diagram: success over {x} and {y}"
        wanted.append((caption, plot_phase, "success", {"x": x, "y": y}))
    out, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="nph-report-") as folder:
        for i, (caption, draw, metric, axes) in enumerate(wanted):
            path = Path(folder) / f"{i}.png"
            for facet in (None, "model"):  # too many lines for one panel: one panel per model
                try:
                    draw(rows, path, metric=metric, size=(900, 520), facet=facet, **axes)
                    out.append(
                        (caption + (", one panel per model" if facet else ""), path.read_bytes())
                    )
                    break
                except NphError as error:
                    reason = str(error)
            else:
                skipped.append(f"{caption}: {reason}")
    out += [(f"comparison picture {grid.name}", _png(grid)) for grid in grids]
    return out, skipped


def _png(path: Path) -> bytes:
    """A picture file as PNG bytes (JPEG and WebP pictures are converted)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
    except (OSError, UnidentifiedImageError):
        raise NphError(f"--grid {path}: not a picture nph can read (PNG, JPEG or WebP)") from None
    return buffer.getvalue()


def write_report(
    out: str | os.PathLike,
    rows: list[dict[str, Any]],
    sources: list[dict[str, Any]],
    *,
    grids: list[Path] | None = None,
    title: str = "nph report",
    force: bool = False,
) -> Path:
    """Write the report of result `rows` read from `sources` (`sweeps.reading.read_inputs`) and
    comparison pictures `grids` to `out`, atomically."""
    grids = grids or []
    for grid in grids:
        if not grid.is_file():
            raise NphError(f"--grid {grid} not found")
    if not sources and not grids:
        raise NphError("give results files, --grid pictures, or both")
    shown, skipped = figures(rows, grids) if rows else (_only(grids), [])
    page = render(rows, sources, shown, skipped, title=title)
    with atomic_write(out, force=force) as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return Path(out)


def _only(grids: list[Path]) -> list[tuple[str, bytes]]:
    return [(f"comparison picture {grid.name}", _png(grid)) for grid in grids]


def render(
    rows: list[dict[str, Any]],
    sources: list[dict[str, Any]],
    shown: list[tuple[str, bytes]],
    skipped: list[str],
    *,
    title: str,
) -> str:
    """The HTML page."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        "<h2>Provenance</h2>",
        _provenance(rows, sources),
    ]
    if rows:
        header, body, metrics = setting_table(rows)
        parts += ["<h2>Settings and metrics</h2>", _table(header, body, metrics)]
    if shown:
        parts.append("<h2>Figures</h2>")
    for caption, png in shown:
        data = base64.b64encode(png).decode("ascii")
        parts.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{e(caption)}">'
            f"<figcaption>{e(caption)}</figcaption></figure>"
        )
    parts += [f'<p class="note">Not drawn: {e(reason)}</p>' for reason in skipped]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _provenance(rows: list[dict[str, Any]], sources: list[dict[str, Any]]) -> str:
    import torch

    from nphcli.version import __version__

    e = html.escape
    items = [
        ("report made", datetime.datetime.now().astimezone().isoformat(timespec="seconds")),
        ("report made with", f"nph {__version__}, torch {torch.__version__}"),
    ]
    for column in PROVENANCE:
        values = sorted({short(row.get(column)) for row in rows if row.get(column) is not None})
        if values:
            shown = ", ".join(values[:12]) + (
                f" (and {len(values) - 12} more)" if len(values) > 12 else ""
            )
            items.append((column, shown))
    lines = [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in items]
    for source in sources:
        text = f"{source['kind']}: {source['rows']} rows"
        lines.append(f"<tr><th>input {e(source['path'])}</th><td>{e(text)}</td></tr>")
        if source["config"]:
            config = json.dumps(source["config"], indent=1, sort_keys=True)
            lines.append(
                f"<tr><th>recorded config</th><td><pre><code>{e(config)}</code></pre></td></tr>"
            )
    return "<table>" + "".join(lines) + "</table>"


def _table(header: list[str], body: list[list[Any]], metrics: list[str]) -> str:
    """The settings table; the best value of each metric column in bold (ties all marked)."""
    e = html.escape
    best = {}
    for i, metric in enumerate(metrics, start=2):
        values = [row[i] for row in body if row[i] is not None]
        if values:
            best[i] = max(values) if METRICS[metric] else min(values)
    titles = [e(METRIC_LABELS.get(h, h)) for h in header]
    head = "".join(f'<th title="{t}">{e(h)}</th>' for h, t in zip(header, titles, strict=True))
    lines = []
    for row in body:
        cells = [f"<td>{e(str(row[0]))}</td>", f'<td class="num">{row[1]}</td>']
        for i, value in enumerate(row[2:], start=2):
            text = "" if value is None else f"{value:.4g}"
            mark = (
                ' class="num best"'
                if value is not None and value == best.get(i)
                else ' class="num"'
            )
            cells.append(f"<td{mark}>{text}{' ★' if 'best' in mark else ''}</td>")
        lines.append("<tr>" + "".join(cells) + "</tr>")
    note = (
        "<p>Means over trials; ★ marks the best value of each column (highest success, "
        "cosine and pixel success; lowest error, support and time).</p>"
    )
    return f'{note}<div class="scroll"><table><tr>{head}</tr>{"".join(lines)}</table></div>'
