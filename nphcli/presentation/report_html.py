"""One self-contained HTML page of a study: one section per experiment (`report_sections`), its
figures first (`report_figures`), the settings every row shares stated once, a compact table of
what varies, provenance; then the comparison pictures. Figures and style are inline and nothing
is loaded, so the page opens offline, in a mail attachment, or printed.
"""

from __future__ import annotations

import base64
import datetime
import io
import json
import os
from html import escape
from pathlib import Path
from typing import Any

from nphcli.core.atomic import atomic_write
from nphcli.core.errors import NphError
from nphcli.presentation.plot_data import METRIC_LABELS
from nphcli.presentation.report_figures import section_figures
from nphcli.presentation.report_sections import (
    METRICS,
    Section,
    Table,
    check_facet,
    compact_table,
    sections,
)

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
    where: list[str] | None = None,
    facet: str | None = None,
    force: bool = False,
) -> Path:
    """Write the report of result `rows` read from `sources` (`sweeps.reading.read_inputs`),
    kept where they match `where` and split into panels by `facet` (as `nph plot`), and of
    comparison pictures `grids`, to `out`, atomically."""
    grids = grids or []
    for grid in grids:
        if not grid.is_file():
            raise NphError(f"--grid {grid} not found")
    if not sources and not grids:
        raise NphError("give results files, --grid pictures, or both")
    found = sections(rows, sources, where) if rows else []
    check_facet(facet, found)
    drawn = [section_figures(section.rows, facet) for section in found]
    pictures = [(f"comparison picture {grid.name}", _png(grid)) for grid in grids]
    page = render(found, drawn, pictures, title=title, where=where or [], facet=facet)
    with atomic_write(out, force=force) as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return Path(out)


def render(
    found: list[Section],
    drawn: list[tuple[list[tuple[str, bytes]], list[str]]],
    pictures: list[tuple[str, bytes]],
    *,
    title: str,
    where: list[str],
    facet: str | None = None,
) -> str:
    """The HTML page: a summary, one section per experiment, the comparison pictures."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        _summary(found, where, facet),
    ]
    for number, (section, (shown, notes)) in enumerate(zip(found, drawn, strict=True), start=1):
        parts += _section(number, section, shown, notes)
    if pictures:
        parts.append("<h2>Comparison pictures</h2>")
        parts += [_figure(caption, png) for caption, png in pictures]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _summary(found: list[Section], where: list[str], facet: str | None) -> str:
    import torch

    from nphcli.version import __version__

    made = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    inputs = len({section.source["path"] for section in found})
    rows = sum(len(section.rows) for section in found)
    text = (
        f"{rows} result rows from {inputs} input file{'s' * (inputs != 1)}, in {len(found)} "
        f"section{'s' * (len(found) != 1)}: one per input file and memory. Rows of different "
        "inputs or memories are never averaged together; within a section, a line of a table or "
        "a point of a plot averages only rows that differ in their trial."
    )
    if where:
        text += " Only rows with " + " and ".join(where) + " (--where)."
    if facet:
        text += f" One panel per {facet} (--facet) where it varies."
    made_with = f"Made {made} with nph {__version__}, torch {torch.__version__}."
    return f'<p>{escape(text)}</p><p class="note">{escape(made_with)}</p>'


def _section(number: int, section: Section, shown: list, notes: list[str]) -> list[str]:
    table = compact_table(section.rows)
    parts = [f"<section><h2>{number}. {escape(section.title)}</h2>"]
    about = f"{section.source['kind']}; {len(section.rows)} rows"
    if section.memory:
        about += f"; memory {section.memory}"
    if section.split > 1:
        about += (
            f". This file holds rows of {section.split} memories: one section each, never "
            "averaged together"
        )
    parts.append(f'<p class="note">{escape(about)}.</p>')
    if table.constants:
        items = " · ".join(f"{k} = {v}" for k, v in table.constants)
        parts.append(f"<p><b>Same in every row:</b> {escape(items)}</p>")
    parts += [_figure(caption, png) for caption, png in shown]
    parts += [f'<p class="note">Not drawn: {escape(note)}</p>' for note in notes]
    if table.columns or table.metrics:
        parts.append(_table(table))
    parts.append(_provenance(section, table))
    parts.append("</section>")
    return parts


def _figure(caption: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{escape(caption)}">'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
    )


def _provenance(section: Section, table: Table) -> str:
    """Where the section's rows came from: the input file, the provenance every row shares,
    and the config every record of retrieve/batch JSON shares."""
    source = section.source
    items = [("input", f"{source['path']} ({source['kind']}, {source['rows']} rows)")]
    items += table.provenance
    lines = [f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in items]
    if source.get("config"):
        config = json.dumps(source["config"], indent=1, sort_keys=True)
        lines.append(
            f"<tr><th>config shared by every record</th><td><details><summary>show</summary>"
            f"<pre><code>{escape(config)}</code></pre></details></td></tr>"
        )
    return f"<h3>Provenance</h3><table>{''.join(lines)}</table>"


def _table(table: Table) -> str:
    """The compact table; the best value of each metric column in bold (ties all marked)."""
    at = len(table.columns) + 1  # the first metric's cell
    best = {}
    for i, metric in enumerate(table.metrics, start=at):
        values = [line[i] for line in table.body if line[i] is not None]
        if values:
            best[i] = max(values) if METRICS[metric] else min(values)
    header = [*table.columns, *(["rows"] if table.count else []), *table.metrics]
    titles = [METRIC_LABELS.get(h, h) for h in header]
    head = "".join(
        f'<th title="{escape(t)}">{escape(h)}</th>' for h, t in zip(header, titles, strict=True)
    )
    lines = []
    for line in table.body:
        cells = [f"<td>{escape(str(v))}</td>" for v in line[: len(table.columns)]]
        if table.count:
            cells.append(f'<td class="num">{line[len(table.columns)]}</td>')
        for i, value in enumerate(line[at:], start=at):
            text = "" if value is None else f"{value:.4g}"
            if value is not None and value == best.get(i):
                cells.append(f'<td class="num best">{text} ★</td>')
            else:
                cells.append(f'<td class="num">{text}</td>')
        lines.append("<tr>" + "".join(cells) + "</tr>")
    follows = "; ".join(f"{c} follows {lead}" for c, lead in table.follows.items())
    note = (
        '<p class="note">One line per setting, means over its rows; ★ marks the best value of each '
        f"column (highest {_names(True)}; lowest {_names(False)})."
        + (f" Not shown: {escape(follows)} (one value per value)." if follows else "")
        + "</p>"
    )
    return f'{note}<div class="scroll"><table><tr>{head}</tr>{"".join(lines)}</table></div>'


def _names(higher: bool) -> str:
    """The report's metric columns where larger (`higher`) or smaller is better."""
    return ", ".join(metric for metric, best in METRICS.items() if best == higher)
