"""nph report: one self-contained HTML page, checked as written and as a browser shows it."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import phase_rows, write_jsonl
from PIL import Image

from nphcli.presentation.report_sections import compact_table, sections
from nphcli.sweeps.reading import read_inputs

CHROMIUM = Path("/usr/bin/chromium")


def _report(invoke, tmp_path, *extra):
    results = write_jsonl(tmp_path / "sweep.jsonl", phase_rows())
    grid = tmp_path / "grid.png"
    Image.new("L", (40, 20), 128).save(grid)
    out = tmp_path / "report.html"
    result = invoke("report", results, "--grid", grid, "--out", out, *extra)
    assert result.exit_code == 0, result.stderr
    return out, result


def test_report_is_one_self_contained_page(invoke, tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out, result = _report(invoke, tmp_path)
    assert result.stderr.strip() == f"wrote {out} (open it in a browser)"
    assert "\x1b[" not in result.stderr
    page = out.read_text()
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # nothing to fetch
    assert "<script" not in page and "@import" not in page and "url(" not in page
    assert "@media print" in page
    # line plots (success, sse), the phase diagram and the picture, all inline PNG
    assert page.count('<img src="data:image/png;base64,') == 4
    assert "phase diagram: success over beta and noise" in page
    # the best value of each metric column is marked
    best = re.findall(r'<td class="num best">([^<]*)</td>', page)
    assert best and all("★" in cell for cell in best)
    assert "1 ★" in best  # success 1.0 is the highest success


def test_report_reads_retrieve_json_lines(invoke, tmp_path):
    record = {
        "config": {
            "model": "topk", "params": {"k": 3}, "seed": 7, "device": "cpu", "dtype": "float32",
            "memory": {"file": "m.safetensors", "M": 10}, "nph_version": "9.9",
            "corruption": {"mask": 0.5, "noise": 0.0},
        },
        "metrics": {"success": {"mean": 0.9}, "sse": {"mean": 1.5}},
        "timing": {"us_per_query": 3.0},
    }  # fmt: skip
    other = json.loads(json.dumps(record))
    other["config"]["params"]["k"] = 5
    other["metrics"]["success"]["mean"] = 0.7
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n" + json.dumps(other) + "\n")
    out = tmp_path / "r.html"
    result = invoke("report", path, "--out", out)
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    assert '<th title="k">k</th>' in page  # k varies: a column of its own
    assert "<td>3</td>" in page and "<td>5</td>" in page and "9.9" in page  # recorded version
    assert '<td class="num best">0.9 ★</td>' in page
    # the config shown is what both records share, never the first one's k
    assert "&quot;k&quot;: 3" not in page and "&quot;seed&quot;: 7" in page


def test_report_bad_inputs_are_one_error_line(invoke, tmp_path):
    result = invoke("report", tmp_path / "missing.jsonl", "--out", tmp_path / "r.html")
    assert result.exit_code == 2 and "not found" in result.stderr
    result = invoke("report", "--out", tmp_path / "r.txt")
    assert result.exit_code == 2 and ".html" in result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("name", "text", "looks"),
    [
        ("nums.csv", "1.0,2.0,3.0\n-0.132,0.1257,4\n", "a table of numbers without a header row"),
        ("people.csv", "name,age\nbob,3\n", "a CSV file with the columns name, age"),
        ("other.jsonl", '{"a": 1, "b": 2}\n', "JSON Lines of objects with the keys a, b"),
        ("bare.csv", "dense,0.1,1\ndense,1,1\n", "has no header row"),
    ],
)
@pytest.mark.parametrize("command", ["report", "plot"])
def test_a_file_nph_did_not_write_is_refused_by_what_it_looks_like(
    invoke, tmp_path, command, name, text, looks
):
    """`nph report` took any numeric CSV as results (exit 0, a page of nonsense) and `nph plot`
    blamed a missing header row: both refuse a file whose first row is not one nph writes."""
    from conftest import assert_one_error_line

    path = tmp_path / name
    path.write_text(text)
    out = tmp_path / ("r.html" if command == "report" else "r.png")
    assert_one_error_line(invoke(command, path, "--out", out), name, looks)
    assert not out.exists()


PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  document.body.dataset.images = images.length;
  document.body.dataset.loaded = images.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.errors = window.__errors.length;
});
</script>"""
TRAP = "<script>window.__errors = []; window.onerror = (m) => window.__errors.push(m);"
TRAP += "const e = console.error; console.error = (...a) => { window.__errors.push(a); e(...a); };"
TRAP += "</script>"


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (apt-get install chromium)")
def test_report_renders_in_headless_chromium(invoke, tmp_path):
    out, _ = _report(invoke, tmp_path)
    page = out.read_text()
    assert "<script" not in page
    probed = tmp_path / "probed.html"  # the report plus a probe; the report itself has no script
    probed.write_text(page.replace("<head>", "<head>" + TRAP).replace("</body>", PROBE + "</body>"))
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
        "--window-size=1280,1600",
    ]  # fmt: skip
    dom = subprocess.run(
        [str(CHROMIUM), *flags, "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stderr[-2000:]
    attributes = dict(re.findall(r'data-(\w+)="(\d+)"', body.group(1)))
    assert attributes == {"images": "4", "loaded": "4", "errors": "0"}, dom.stderr[-2000:]
    shot = tmp_path / "shot.png"
    subprocess.run(
        [str(CHROMIUM), *flags, f"--screenshot={shot}", out.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    with Image.open(shot) as image:
        grey = image.convert("L")
        low, high = grey.getextrema()
        assert image.size == (1280, 1600) and high - low > 100  # text and tables, not blank
        assert sum(grey.histogram()[:128]) > 1000  # dark pixels: text, lines
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)


@pytest.fixture(scope="module")
def four_inputs(tmp_path_factory):
    """A study as a user makes it: sweeps of two different memories, `nph retrieve --csv` and
    `nph batch` JSON Lines of a stored memory (the first sweep's pool)."""
    from typer.testing import CliRunner

    from nphcli.cli import app

    folder = tmp_path_factory.mktemp("study")
    rng = np.random.default_rng(0)
    runner = CliRunner()

    def nph(*args, stdout=None):
        result = runner.invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        if stdout:
            (folder / stdout).write_text(result.stdout)

    for name in ("a", "b"):
        np.save(folder / f"{name}.npy", rng.normal(size=(40, 12)).astype(np.float32))
    common = ("--model", "dense,topk", "--k", "2,5", "--sizes", "10,20", "--trials", "2")
    common += ("--noise", "0.5,1", "--beta", "0.3,1", "--threads", "1")
    nph("sweep", "--dataset", folder / "a.npy", *common, "--out", folder / "sa.jsonl")
    nph("sweep", "--dataset", folder / "b.npy", *common, "--out", folder / "sb.csv")
    memory = folder / "mem.safetensors"
    nph("store", folder / "a.npy", "--out", memory)
    nph("retrieve", "--memory", memory, "--model", "dense,topk", "--k", "1,5", "--mask",
        "0.25,0.5", "--queries", "8", "--csv", stdout="r.csv")  # fmt: skip
    jobs = folder / "jobs.jsonl"
    jobs.write_text(
        "".join(
            json.dumps(
                {
                    "memory": str(memory),
                    "model": m,
                    "beta": [0.1, 1, 10],
                    "noise": [0.2, 0.8],
                    "queries": 8,
                }
            )
            + "\n"
            for m in ("dense", "sparse")
        )  # fmt: skip
    )
    nph("batch", jobs, stdout="b.jsonl")
    return [folder / name for name in ("sa.jsonl", "sb.csv", "r.csv", "b.jsonl")]


def _tables(page: str) -> list[list[list[str]]]:
    """Each section's table as rows of cell texts (header first)."""
    found = []
    for section in re.findall(r"<section>(.*?)</section>", page, flags=re.S):
        table = re.search(r'<div class="scroll"><table>(.*?)</table>', section, flags=re.S)
        if table:
            rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), flags=re.S)
            found.append(
                [[html.unescape(c) for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r)]
                 for r in rows]
            )  # fmt: skip
    return found


@pytest.mark.slow
def test_four_input_report_has_one_compact_section_per_input(invoke, four_inputs, tmp_path):
    out = tmp_path / "study.html"
    result = invoke("report", *four_inputs, "--out", out)
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    titles = re.findall(r"<h2>\d+\. ([^<]*)</h2>", page)
    assert titles == [str(path) for path in four_inputs]  # one section per input, in order
    tables = _tables(page)
    assert len(tables) == 4
    for table in tables:
        header, *body = table
        assert len(body) > 1
        for i, name in enumerate(header):  # every column varies within its section
            assert len({line[i].replace(" ★", "") for line in body}) > 1, (name, header)
    # constants stated once, above the figures; the sweep's columns that follow M are named
    for section in re.findall(r"<section>(.*?)</section>", page, flags=re.S):
        same = section.index("Same in every row")
        assert same < section.index("<figure>") < section.index('<div class="scroll">')
    assert "batch_size follows M" in page and "memory_shape follows M" in page
    # provenance per input: each sweep's whole content hash, the two memories apart
    rows, sources = read_inputs(four_inputs)
    hashes = {row["memory_sha256"] for row in rows}
    assert len(hashes) == 2 and all(page.count(h) >= 1 for h in hashes)
    assert "Rows of different inputs or memories are never averaged together" in page
    assert "Not drawn" not in page


def test_sections_split_a_merged_file_by_memory_and_apply_where():
    rows = phase_rows()
    for row in rows:
        row["memory_sha256"] = ("a" if row["model"] == "dense" else "b") * 64
    source = {"path": "merged.jsonl", "kind": "rows", "rows": len(rows), "config": None}
    found = sections(rows, [source])
    assert [s.title for s in found] == ["merged.jsonl · memory aaaaaaaaaaaa",
                                        "merged.jsonl · memory bbbbbbbbbbbb"]  # fmt: skip
    assert all(s.split == 2 for s in found) and sum(len(s.rows) for s in found) == len(rows)
    kept = sections(rows, [source], where=["model=sparse", "beta=1,10"])
    assert [len(s.rows) for s in kept] == [12]  # 2 β × 3 noise × 2 trials of sparse
    from nphcli.core.errors import NphError

    with pytest.raises(NphError, match="no column 'colour'"):
        sections(rows, [source], where=["colour=red"])


def test_compact_table_states_constants_once_and_folds_followers():
    rows = phase_rows()
    for row in rows:
        row["Q"] = row["batch_size"] = 100  # constant: said once
        row["label"] = row["model"]
    table = compact_table(rows)
    assert table.columns == ["model", "beta", "noise"]
    assert ("M", "100") in table.constants and ("Q", "100") in table.constants
    assert ("runs per line", "2 (trials averaged)") in table.constants and not table.count
    assert table.metrics == ["success", "sse"]
    first = table.body[0]  # dense, β 0.1, noise 0: success 0.51 and 0.61 (trials 0, 1) averaged
    assert first[:3] == ["dense", "0.1", "0"] and first[4] == pytest.approx((0.51 + 0.61) / 2)
    # k follows the model here and so is a column; a column following M one to one is folded
    for row in rows:
        row["M"] = 100 if row["noise"] < 1 else 200
        row["memory_shape"] = f"{row['M']}x8"
    table = compact_table(rows)
    assert table.follows == {"memory_shape": "M"} and "memory_shape" not in table.columns


def test_hostile_labels_are_escaped_and_never_tex(invoke, tmp_path):
    rows = phase_rows()
    for row in rows:
        row["label"] = row["model"] = f"<script>alert(1)</script>{row['model']} $x^$ &"
    results = write_jsonl(tmp_path / "hostile.jsonl", rows)
    out = tmp_path / "h.html"
    result = invoke("report", results, "--out", out, "--title", "<b>$\\frac{$</b>")
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    assert "<script" not in page and "<b>$" not in page and "&lt;script&gt;" in page
    plot = invoke("plot", results, "--out", tmp_path / "h.png", "--title", "$\\frac{$")
    assert plot.exit_code == 0, plot.stderr


def test_report_where_and_facet(invoke, tmp_path):
    results = write_jsonl(tmp_path / "sweep.jsonl", phase_rows())
    out = tmp_path / "w.html"
    result = invoke("report", results, "--out", out, "--where", "model=sparse", "--facet", "beta")
    assert result.exit_code == 0, result.stderr
    page = out.read_text()
    assert "Only rows with model=sparse (--where)" in page and "one panel per beta" in page
    assert "<td>dense</td>" not in page and "model = sparse" in page  # a constant now
    bad = invoke("report", results, "--out", out, "--force", "--facet", "colour")
    assert bad.exit_code == 2 and "--facet 'colour'" in bad.stderr
    none = invoke("report", results, "--out", out, "--force", "--where", "model=hopfield")
    assert none.exit_code == 2 and "no rows match" in none.stderr


def _grid_rows(**levels):
    """One row per combination of `levels` over β × noise (2 × 2) and M (10, 20)."""
    import itertools

    names = list(levels)
    rows = []
    for combo in itertools.product(*levels.values()):
        for beta, noise, size in itertools.product((0.1, 1.0), (0.0, 1.0), (10, 20)):
            success = min(1.0, max(0.0, 0.9 - noise * 0.5 + 0.05 * beta))
            rows.append({"model": "dense", **dict(zip(names, combo, strict=True)), "beta": beta,
                         "noise": noise, "M": size, "success_mean": success,
                         "sse_mean": 1 - success})  # fmt: skip
    return rows


@pytest.fixture
def drawn_kinds(monkeypatch) -> set:
    """Draws the first figure of each kind (lines, phase diagram) and only captions the others
    (a figure of many panels takes seconds): for tests of how rows are split into figures and
    panels. Returns the kinds drawn."""
    from nphcli.presentation import report_figures

    real, kinds = report_figures._draw, set()

    def draw_first(rows, caption, notes, **options):
        kind = "phase diagram" if options.get("y") else "lines"
        if kind in kinds:
            return [(caption, b"")]
        kinds.add(kind)
        return real(rows, caption, notes, **options)

    monkeypatch.setattr(report_figures, "_draw", draw_first)
    return kinds


def test_many_lines_become_panels_and_many_panels_become_figures(drawn_kinds):
    from nphcli.presentation.report_figures import LINES, PANELS, section_figures

    # 3 × 4 × 2 settings beside β and noise: panels per b, one figure per a for the phase
    rows = _grid_rows(a=["p", "q", "r"], b=[1, 2, 3, 4], c=["u", "v"])
    drawn, notes = section_figures(rows)
    captions = [caption for caption, _ in drawn]
    assert not notes
    assert len(drawn_kinds) == 2 and sum(png.startswith(b"\x89PNG") for _, png in drawn) == 2
    lines = [c for c in captions if c.startswith(("success against", "sse against"))]
    assert lines and all(", one panel per" in c for c in lines)
    phases = [c for c in captions if c.startswith("phase diagram")]
    assert len(phases) > 1 and all("(" in c for c in phases)  # one figure per group
    assert phases == sorted(phases, key=lambda c: c)  # in order
    assert LINES == 10 and PANELS == 9
    # far too many: nothing unreadable is drawn, and the note says how to narrow the rows
    rows = _grid_rows(a=list("pqrstuvw"), b=list(range(8)), c=list("ijklmnop"))
    drawn, notes = section_figures(rows)
    assert not any(c.startswith("success against") for c, _ in drawn)
    assert any("--where" in note and "figures would be needed" in note for note in notes)


def test_report_facet_names_a_setting_it_splits(invoke, tmp_path, drawn_kinds):
    results = write_jsonl(tmp_path / "grid.jsonl", _grid_rows(a=["p", "q"]))
    out = tmp_path / "f.html"
    result = invoke("report", results, "--out", out, "--facet", "a")
    assert result.exit_code == 0, result.stderr
    assert "one panel per a" in out.read_text()
