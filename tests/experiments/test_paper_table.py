"""The paper's tables as data and the paper-vs-nph comparison (`nphcli.experiments.paper_table`)."""

from __future__ import annotations

import csv
import json
import statistics

import pytest

from nphcli.core.errors import NphError
from nphcli.experiments import paper_table as pt

# Typed again here from the paper (not copied from the module), so a typo in either shows.
MIL_FROM_ISSUE = {
    "dense": (0.813, 0.563, 0.877, 0.524),
    "sparse": (0.830, 0.573, 0.893, 0.585),
    "topk-20%": (0.824, 0.562, 0.848, 0.586),
    "topk-50%": (0.812, 0.566, 0.852, 0.572),
    "topk-80%": (0.812, 0.560, 0.872, 0.551),
    "random-feature": (0.802, 0.508, 0.875, 0.566),
    "linear": (0.797, 0.571, 0.869, 0.561),
}
ETTH1_96_MSE_FROM_ISSUE = {
    "dense": 0.137,
    "sparse": 0.144,
    "topk-20%": 0.148,
    "topk-50%": 0.153,
    "topk-80%": 0.147,
    "window": 1.043,
    "random-feature": 0.147,
    "linear": 0.149,
}


def test_the_mil_table_is_the_papers():
    table = pt.get_table("mil_benchmark")
    assert table.columns == ("Tiger", "Fox", "Elephant", "UCSB") and table.higher_is_better
    assert {(r, c): table.values[r, c] for r in table.rows for c in table.columns} == {
        (r, c): v
        for r, printed in MIL_FROM_ISSUE.items()
        for c, v in zip(table.columns, printed, strict=True)
    }


def test_the_time_series_table_is_the_papers():
    table = pt.get_table("mts-result")
    assert not table.higher_is_better
    assert len(table.columns) == 5 * 4 * 2 and len(table.rows) == 8
    for row, value in ETTH1_96_MSE_FROM_ISSUE.items():
        assert table.values[row, "ETTh1/96/MSE"] == value
    # spot checks from the paper's source: the last cell, a MAE, the unreadable "0.31o"
    assert table.values["linear", "Traffic/720/MAE"] == 0.660
    assert table.values["sparse", "ETTh1/720/MAE"] == 0.314
    missing = [key for key in table.values if table.values[key] is None]
    assert missing == [("topk-80%", "ETTm1/96/MAE")]
    assert len(table.values) == len(table.rows) * len(table.columns)


def test_compare_against_statistics_module():
    table = pt.get_table("mil_benchmark")
    seeds = [0.80, 0.83, 0.79, 0.85, 0.81]
    cells = pt.compare(table, {("dense", "Tiger"): seeds}, rows=["dense"], columns=["Tiger", "Fox"])
    tiger, fox = cells
    assert tiger.mean == pytest.approx(statistics.mean(seeds))
    assert tiger.std == pytest.approx(statistics.stdev(seeds))
    assert tiger.difference == pytest.approx(statistics.mean(seeds) - 0.813)
    assert tiger.within is (abs(tiger.difference) <= tiger.std) and tiger.within
    assert tiger.better is (tiger.mean > 0.813) and tiger.seeds == 5
    assert fox.mean is None and fox.within is None and fox.seeds == 0 and fox.paper == 0.563


def test_within_and_better_follow_the_tables_direction():
    mil = pt.get_table("mil_benchmark")
    far = pt.compare(mil, {("sparse", "UCSB"): [0.70, 0.71]}, rows=["sparse"], columns=["UCSB"])[0]
    assert far.within is False and far.better is True  # AUC above the paper's 0.585
    ts = pt.get_table("mts-result")
    cell = pt.compare(
        ts, {("dense", "ETTh1/96/MSE"): [0.2]}, rows=["dense"], columns=["ETTh1/96/MSE"]
    )[0]
    assert cell.std is None and cell.within is None and cell.better is False  # MSE above 0.137
    two = pt.compare(
        ts, {("dense", "ETTh1/96/MSE"): [0.137, 0.137]}, rows=["dense"], columns=["ETTh1/96/MSE"]
    )[0]
    assert two.std == 0.0 and two.within is True


def test_summary_names_the_cells_outside():
    table = pt.get_table("mil_benchmark")
    results = {("dense", "Tiger"): [0.813, 0.813], ("dense", "Fox"): [0.9, 0.91]}
    cells = pt.compare(table, results, rows=["dense"])
    assert pt.summary(cells) == {
        "compared": 2, "within": 1, "outside": ["dense Fox"], "not_comparable": 0,
        "one_seed": 0,
    }  # fmt: skip
    assert [c.verdict for c in cells] == ["within", "outside", None, None]


def test_a_row_the_released_code_breaks_is_not_comparable():
    table = pt.get_table("mil_benchmark")
    results = {("linear", "Tiger"): [0.79, 0.80], ("bag-size", "Tiger"): [0.6, 0.62]}
    cells = pt.compare(table, results, rows=["linear", "bag-size"], columns=["Tiger"])
    assert [c.verdict for c in cells] == ["not comparable", "baseline"]
    assert "padding mask" in cells[0].reason and cells[1].reason is None
    assert pt.summary(cells) == {
        "compared": 0, "within": 0, "outside": [], "not_comparable": 1, "one_seed": 0,
    }  # fmt: skip
    assert pt.markdown(cells).splitlines()[2].startswith("| Linear | *0.795 ± 0.007 (0.797)*")


def test_unknown_names_are_user_errors():
    with pytest.raises(NphError, match="unknown paper table"):
        pt.get_table("nope")


def test_a_column_the_paper_lacks_has_no_paper_value():
    cells = pt.compare(
        pt.get_table("mil_benchmark"), {("dense", "Musk1"): [0.9]}, columns=["Musk1"]
    )
    assert cells[0].paper is None and cells[0].mean == 0.9 and cells[0].within is None
    assert pt.summary(cells)["compared"] == 0


def test_json_and_csv_round_trip(tmp_path):
    table = pt.get_table("mil_benchmark")
    cells = pt.compare(table, {("dense", "Elephant"): [0.85, 0.87, 0.88]})
    pt.write_json(tmp_path / "t.json", table, cells, {"nph_version": "x", "protocol": "quick"})
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["table"] == "mil_benchmark" and data["protocol"] == "quick"
    assert len(data["cells"]) == 7 * 4 and data["summary"]["compared"] == 1
    pt.write_csv(tmp_path / "t.csv", cells)
    with open(tmp_path / "t.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    dense = next(r for r in rows if r["row"] == "dense" and r["column"] == "Elephant")
    assert float(dense["mean"]) == pytest.approx(0.8666666, abs=1e-6)
    assert dense["within"] == "True" and dense["verdict"] == "within" and rows[0]["mean"] == ""


def test_draw_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from nphcli.experiments.paper_files import draw

    table = pt.get_table("mil_benchmark")
    cells = pt.compare(table, {("dense", c): [0.7, 0.8] for c in table.columns})
    draw(tmp_path / "t.png", table, cells)
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_marks_the_cells_outside_the_spread():
    table = pt.get_table("mil_benchmark")
    results = {("dense", "Tiger"): [0.80, 0.82], ("dense", "Fox"): [0.9, 0.91]}
    text = pt.markdown(pt.compare(table, results, rows=["dense"], columns=["Tiger", "Fox"]))
    assert text.splitlines() == [
        "| model | Tiger | Fox |",
        "| --- | --- | --- |",
        "| Dense | 0.810 ± 0.014 (0.813) | **0.905 ± 0.007 (0.563)** |",
    ]


def test_one_seed_has_no_spread_anywhere(capsys, monkeypatch):
    """One seed printed `0.200 ± 0.000 ... NO` and its picture said "± spread over seeds":
    now "n/a (1 seed)" in the table, the Markdown and the JSON (null), and the picture's
    caption says 1 seed."""
    from matplotlib.text import Text

    from nphcli.cli.paper import render_comparison
    from nphcli.experiments.paper_files import comparison_figure

    table = pt.get_table("mts-result")
    columns = ["ETTh1/96/MSE", "ETTh1/96/MAE"]
    cells = pt.compare(
        table, {("dense", c): [0.2] for c in columns}, rows=["dense"], columns=columns
    )
    assert pt.spread_text(cells[0]) == "0.200 ± n/a (1 seed)"
    assert pt.summary(cells) == {
        "compared": 0, "within": 0, "outside": [], "not_comparable": 0, "one_seed": 2,
    }  # fmt: skip
    assert "± 0.000" not in pt.markdown(cells) and "n/a (1 seed)" in pt.markdown(cells)
    assert pt.cells_json(table, cells, {})["cells"][0]["std"] is None
    monkeypatch.setenv("COLUMNS", "200")
    render_comparison(table, cells, {}, as_json=False)
    shown = capsys.readouterr().out
    assert "n/a (1 seed)" in shown and "0.000" not in shown and "NO" not in shown
    assert "over 1 seed" in shown
    caption = comparison_figure(table, cells)._suptitle.get_text()
    assert "1 seed" in caption and "spread over seeds" not in caption
    texts = [t.get_text() for t in comparison_figure(table, cells).findobj(Text)]
    assert not any("± spread" in t for t in texts)


def test_the_caption_counts_the_seeds_each_cell_has():
    from nphcli.experiments.paper_files import comparison_figure

    table = pt.get_table("mil_benchmark")
    cells = pt.compare(
        table, {("dense", "Tiger"): [0.8, 0.82], ("dense", "Fox"): [0.5]}, rows=["dense"],
        columns=["Tiger", "Fox"],
    )  # fmt: skip
    assert pt.seeds_text(cells) == "1–2 seeds"
    assert "mean of 1–2 seeds" in comparison_figure(table, cells)._suptitle.get_text()
    series = pt.get_table("mts-result")
    column = "ETTh1/96/MSE"
    with_baseline = pt.compare(
        series,
        {("dense", column): [0.14, 0.15], ("repeat-last", column): [0.132]},
        rows=["dense", "repeat-last"],
        columns=[column],
    )
    assert with_baseline[1].verdict == "baseline"  # one evaluation, not one seed
    assert pt.seeds_text(with_baseline) == "2 seeds"


def test_help_quotes_the_measured_times_the_docs_report():
    """`--help` of the quick presets said "about 10 minutes" where the docs measured 4 min 24 s:
    both now come from `measured.MEASURED`, and each docs page still reports its numbers."""
    from pathlib import Path

    from nphcli.cli.mil import MIL_FIELDS
    from nphcli.cli.paper_mil import PAPER_MIL_FIELDS
    from nphcli.cli.paper_timeseries import TS_FIELDS
    from nphcli.experiments.measured import MEASURED, duration, estimate

    root = Path(__file__).resolve().parents[2]
    for measured in MEASURED.values():
        page = " ".join((root / measured.page).read_text().split())
        for part in measured.seconds:
            assert duration(part) in page, (measured.page, duration(part))
    help_text = " ".join(f.help for fields in (MIL_FIELDS, PAPER_MIL_FIELDS, TS_FIELDS)
                         for f in fields if f.name in ("preset", "protocol"))  # fmt: skip
    for name in MEASURED:
        assert estimate(name) in help_text, name
    assert "about 10 minutes" not in help_text


def test_the_picture_carries_each_cells_verdict():
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_rgba
    from matplotlib.lines import Line2D

    from nphcli.experiments.paper_files import COLOURS, comparison_figure

    table = pt.get_table("mil_benchmark")
    results = {("dense", "Tiger"): [0.80, 0.82], ("linear", "Tiger"): [0.7, 0.72],
               ("bag-size", "Tiger"): [0.6, 0.62]}  # fmt: skip
    cells = pt.compare(table, results, rows=["dense", "linear", "bag-size"], columns=["Tiger"])
    figure = comparison_figure(table, cells)
    lines = [line for line in figure.axes[0].get_lines() if isinstance(line, Line2D)]
    dots = {to_rgba(line.get_color()) for line in lines if line.get_marker() == "o"}
    verdicts = ("within", "not comparable", "baseline")
    assert dots == {to_rgba(COLOURS[v]) for v in verdicts}
    diamonds = [line.get_markerfacecolor() for line in lines if line.get_marker() == "D"]
    assert diamonds == ["black", "none"]  # dense, linear (hollow: not comparable)
    assert "purple: not comparable" in figure._suptitle.get_text()
