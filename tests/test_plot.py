"""nph plot: PNG size, curves (mean ± std over trials), axes, missing matplotlib."""

from __future__ import annotations

import builtins
import csv
import json

import pytest
from PIL import Image

from nphcli.errors import NphError
from nphcli.plot import curves, plot_results


def result_rows():
    """Two model settings × three sizes × two trials, with known SSE values."""
    rows = []
    for label, offset in (("dense", 10.0), ("topk k=0.2", 5.0)):
        for size in (10, 20, 50):
            for trial in (0, 1):
                rows.append(
                    {
                        "setting": f"{label} | M={size}",
                        "label": label,
                        "trial": trial,
                        "dataset": "mnist",
                        "M": size,
                        "mask": 0.5,
                        "noise": 0.0,
                        "beta": 0.01,
                        "sse_mean": offset + size / 10 + trial,  # trials differ by 1
                        "success_mean": 0.5,
                    }
                )
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_plot_writes_a_png_of_the_requested_size(invoke, tmp_path):
    results = write_jsonl(tmp_path / "r.jsonl", result_rows())
    out = tmp_path / "p.png"
    result = invoke("plot", results, "--out", out, "--size", "640x400")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (640, 400)
    again = invoke("plot", results, "--out", out)
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert invoke("plot", results, "--out", out, "--force", "--metric", "success").exit_code == 0
    with Image.open(out) as image:
        assert image.size == (800, 500)


def test_plot_reads_csv(invoke, tmp_path):
    rows = result_rows()
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "p.png"
    assert invoke("plot", path, "--out", out, "--x", "size").exit_code == 0
    assert out.stat().st_size > 1000


def test_curves_are_means_and_population_stds_over_trials():
    x, column, lines = curves(result_rows(), metric="sse")
    assert (x, column) == ("size", "sse_mean")
    assert list(lines) == ["dense", "topk k=0.2"]
    assert lines["dense"] == [(10, 11.5, 0.5, 2), (20, 12.5, 0.5, 2), (50, 15.5, 0.5, 2)]


def test_x_axis_choices():
    rows = [dict(r, M=100, noise=0.5 if r["M"] == 10 else 1.0) for r in result_rows()]
    assert curves(rows)[0] == "noise"
    x, _, lines = curves(rows, x="variance")
    assert x == "variance" and [p[0] for p in lines["dense"]] == [0.25, 1.0]
    with pytest.raises(NphError, match="unknown --x"):
        curves(rows, x="colour")
    with pytest.raises(NphError, match="no values for metric 'speed'"):
        curves(rows, metric="speed")


def test_without_matplotlib_the_error_says_how_to_install(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(NphError, match=r'pip install "nph\[plot\]"'):
        plot_results(result_rows(), tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_bad_size_and_missing_file_are_errors(invoke, tmp_path):
    results = write_jsonl(tmp_path / "r.jsonl", result_rows())
    bad = invoke("plot", results, "--out", tmp_path / "p.png", "--size", "big")
    assert bad.exit_code == 2 and "WIDTHxHEIGHT" in bad.stderr
    missing = invoke("plot", tmp_path / "none.jsonl", "--out", tmp_path / "p.png")
    assert missing.exit_code == 2 and "not found" in missing.stderr
