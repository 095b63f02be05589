"""nph report: one self-contained HTML page, checked as written and as a browser shows it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from tests.test_plot import phase_rows, write_jsonl

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
    assert "k=3" in page and "k=5" in page and "9.9" in page  # settings and recorded version
    assert '<td class="num best">0.9 ★</td>' in page


def test_report_bad_inputs_are_one_error_line(invoke, tmp_path):
    result = invoke("report", tmp_path / "missing.jsonl", "--out", tmp_path / "r.html")
    assert result.exit_code == 2 and "not found" in result.stderr
    result = invoke("report", "--out", tmp_path / "r.txt")
    assert result.exit_code == 2 and ".html" in result.stderr
    assert not list(tmp_path.iterdir())


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
