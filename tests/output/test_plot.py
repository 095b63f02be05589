"""nph plot: PNG size, curves (mean ± std over trials), axes, missing matplotlib."""

from __future__ import annotations

import builtins
import csv

import pytest
from conftest import phase_rows, write_jsonl
from PIL import Image

from nphcli.core.errors import NphError
from nphcli.presentation.plot import curves, plot_results


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


def test_a_seed_the_sweep_drew_per_trial_is_a_trial_not_a_line():
    rows = [
        {"model": "random", "k": 0.2, "M": 10, "trial": t, "seed": s, "run_seed": s, "sse_mean": v}
        for t, s, v in ((0, 11, 1.0), (1, 22, 3.0))
    ]
    assert curves(rows, x="size").lines == {"random": [(10.0, 2.0, 1.0, 2)]}
    given = [{**row, "seed": 5 + row["trial"]} for row in rows]  # seeds the user chose: settings
    assert list(curves(given, x="size").lines) == ["random seed=5", "random seed=6"]


def test_curves_are_means_and_population_stds_over_trials():
    data = curves(result_rows(), metric="sse")
    assert (data.x, data.column) == ("M", "sse_mean")
    assert list(data.lines) == ["dense", "topk k=0.2"]
    assert data.lines["dense"] == [(10, 11.5, 0.5, 2), (20, 12.5, 0.5, 2), (50, 15.5, 0.5, 2)]


def test_x_axis_choices():
    rows = [dict(r, M=100, noise=0.5 if r["M"] == 10 else 1.0) for r in result_rows()]
    assert curves(rows).x == "noise"
    data = curves(rows, x="variance")
    assert data.x == "variance" and [p[0] for p in data.lines["dense"]] == [0.25, 1.0]
    with pytest.raises(NphError, match="unknown --x"):
        curves(rows, x="colour")
    with pytest.raises(NphError, match="no values for metric 'speed'"):
        curves(rows, metric="speed")


def retrieve_rows():
    """`nph retrieve --model topk --k 1,5,10 --csv` as read back: one row per k, no trials
    (k written 1.0 as the CSV does)."""
    return [
        {"model": "topk", "beta": 0.3, "k": float(k), "M": 100, "mask": 0.0, "noise": 0.0,
         "run_seed": 0, "sse_mean": sse, "sse_std": 9.0, "total_s": 0.5}
        for k, sse in ((1, 3.0), (5, 2.0), (10, 2.5))
    ]  # fmt: skip


def test_settings_that_vary_are_never_averaged_as_trials():
    """The three values of k were averaged into one point labelled "topk, 3 trials"; now k is
    the x axis by itself, each point one run, and --x k works."""
    for x in ("auto", "k"):
        data = curves(retrieve_rows(), x=x)
        assert data.x == "k"
        assert data.lines == {"topk": [(1, 3.0, 0.0, 1), (5, 2.0, 0.0, 1), (10, 2.5, 0.0, 1)]}
    # with M on the x axis every k is its own line, not a mean over k
    rows = [dict(r, M=m) for r in retrieve_rows() for m in (50, 100)]
    data = curves(rows, x="size")
    assert sorted(data.lines) == ["topk k=1", "topk k=10", "topk k=5"]
    assert all(p[3] == 1 for line in data.lines.values() for p in line)


def test_where_and_facet():
    rows = result_rows() + [dict(r, beta=0.1) for r in result_rows()]
    data = curves(rows, where=["label=dense"], facet="beta")
    assert list(data.panels) == ["beta=0.01", "beta=0.1"]
    assert all(list(panel) == ["dense"] for panel in data.panels.values())
    both = curves(rows, where=["label=dense,topk k=0.2", "beta=0.1"])
    assert list(both.lines) == ["dense", "topk k=0.2"]
    with pytest.raises(NphError, match="no column 'colour'"):
        curves(rows, where=["colour=red"])
    with pytest.raises(NphError, match="no rows match"):
        curves(rows, where=["beta=7"])
    with pytest.raises(NphError, match="COLUMN=VALUE"):
        curves(rows, where=["dense"])
    with pytest.raises(NphError, match="--facet 'trial'"):
        curves(rows, facet="trial")


def test_identical_values_have_a_std_of_exactly_zero():
    rows = [dict(r, sse_mean=0.1 + 0.2) for r in result_rows()]
    assert {p[2] for line in curves(rows).lines.values() for p in line} == {0.0}


def many_series_rows():
    """40 lines: 5 models × 8 parameter values, over 3 sizes."""
    return [
        {"label": f"model{m} p={p}", "model": f"model{m}", "p": p, "M": size, "trial": 0,
         "sse_mean": m + p / 10 + size / 100}
        for m in range(5) for p in range(8) for size in (10, 20, 50)
    ]  # fmt: skip


@pytest.mark.slow
def test_forty_series_keep_a_whole_legend_and_distinct_looks(tmp_path):
    pytest.importorskip("matplotlib")
    from nphcli.presentation.plot import _look

    looks = [_look(i, 40) for i in range(40)]
    assert len(set(looks)) == 40
    out = plot_results(many_series_rows(), tmp_path / "many.png", size=(1000, 600))
    with Image.open(out) as image:
        assert image.size == (1000, 600)
    faceted = plot_results(many_series_rows(), tmp_path / "facet.png", facet="model")
    assert faceted.stat().st_size > 1000
    too_many = [
        dict(r, p=r["p"] + 100 * t, label=f"x{t}") for t in range(3) for r in many_series_rows()
    ]
    with pytest.raises(NphError, match="too many for one plot"):
        plot_results(too_many, tmp_path / "no.png")
    assert not (tmp_path / "no.png").exists()


def test_plot_cli_where_facet_and_several_files(invoke, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", result_rows())
    b = write_jsonl(tmp_path / "b.jsonl", [dict(r, beta=0.1) for r in result_rows()])
    out = tmp_path / "p.png"
    result = invoke("plot", a, b, "--out", out, "--where", "label=dense", "--facet", "beta")
    assert result.exit_code == 0, result.stderr
    bad = invoke("plot", a, "--out", out, "--force", "--x", "k")
    assert bad.exit_code == 2 and bad.stderr.startswith("Error: unknown --x 'k'")


def test_without_matplotlib_the_error_says_how_to_install(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(NphError, match=r'pip install matplotlib .*pip install -e "\.\[plot\]"'):
        plot_results(result_rows(), tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_bad_size_and_missing_file_are_errors(invoke, tmp_path):
    results = write_jsonl(tmp_path / "r.jsonl", result_rows())
    bad = invoke("plot", results, "--out", tmp_path / "p.png", "--size", "big")
    assert bad.exit_code == 2 and "WIDTHxHEIGHT" in bad.stderr
    missing = invoke("plot", tmp_path / "none.jsonl", "--out", tmp_path / "p.png")
    assert missing.exit_code == 2 and "not found" in missing.stderr


def test_surfaces_are_cells_of_means_and_stds_one_panel_per_model():
    from nphcli.presentation.plot_data import surfaces

    data = surfaces(phase_rows(), x="beta", y="noise")
    assert list(data.panels) == ["dense", "sparse"]
    assert data.xs == [0.1, 1.0, 10.0] and data.ys == [0.0, 0.5, 1.0]
    mean, std, count = data.panels["dense"][(1.0, 0.5)]
    assert (round(mean, 6), round(std, 6), count) == (0.15, 0.05, 2)
    assert data.success["sparse"][(10.0, 1.0)] == pytest.approx(0.85)
    assert data.trials() == [2]
    with pytest.raises(NphError, match="two different"):
        surfaces(phase_rows(), x="noise", y="noise")
    faceted = surfaces(phase_rows(), x="beta", y="noise", facet="model")
    assert list(faceted.panels) == ["model=dense", "model=sparse"]


def test_phase_diagram_draws_panels_boundary_and_spread(tmp_path):
    from nphcli.presentation.plot import plot_results

    svg = plot_results(phase_rows(), tmp_path / "p.svg", x="beta", y="noise").read_text()
    assert svg.count("<image") == 2 + 1  # one heatmap per model, and the colour bar
    assert "stroke: #ffffff; stroke-width: 2" in svg  # the success = 0.5 boundary
    assert "±0.05" in svg  # the spread over two trials, written in the cells
    single = phase_rows(trials=(0,))
    for row in single:
        row["success_mean"] = 0.9  # every cell succeeds: no boundary to draw
    svg = plot_results(single, tmp_path / "q.svg", x="beta", y="noise").read_text()
    assert "stroke: #ffffff; stroke-width: 2" not in svg and "±" not in svg


def test_plot_cli_phase_diagram(invoke, tmp_path):
    results = write_jsonl(tmp_path / "r.jsonl", phase_rows())
    out = tmp_path / "phase.png"
    result = invoke("plot", results, "--x", "beta", "--y", "noise", "--out", out)
    assert result.exit_code == 0, result.stderr
    with Image.open(out) as image:
        assert image.size == (800, 500)
    bad = invoke("plot", results, "--x", "beta", "--y", "colour", "--out", tmp_path / "b.png")
    assert bad.exit_code == 2 and "colour" in bad.stderr


def test_a_fixed_parameter_is_named_on_its_line_and_in_the_title(tmp_path):
    """`nph retrieve --model dense,topk --k 10 --csv` rows: k follows the model, yet the topk
    line says k=10 (never just "topk")."""
    rows = [
        {"model": model, "k": k, "M": size, "beta": 1.0, "sse_mean": size / 10 + (k or 0)}
        for model, k in (("dense", None), ("topk", 10))
        for size in (10, 20)
    ]
    assert sorted(curves(rows, x="size").lines) == ["dense", "topk k=10"]
    only = curves([r for r in rows if r["model"] == "topk"], x="size")
    assert "k 10" in only.fixed and list(only.lines) == ["topk"]
    svg = plot_results(rows[2:], tmp_path / "t.svg", x="size").read_text()
    assert "k 10" in svg  # the title names the fixed k


def test_panels_in_natural_order():
    from nphcli.presentation.plot_data import natural, surfaces

    names = ["topk k=10", "entmax alpha=1.5", "topk k=5", "dense", "topk k=0.5"]
    assert sorted(names, key=natural) == [
        "dense", "entmax alpha=1.5", "topk k=0.5", "topk k=5", "topk k=10",
    ]  # fmt: skip
    rows = [
        {**row, "model": "topk", "label": "topk", "k": k}
        for k in (10, 5, 20)
        for row in phase_rows(trials=(0,))
        if row["model"] == "dense"
    ]
    assert list(surfaces(rows, x="beta", y="noise").panels) == [
        "topk k=5", "topk k=10", "topk k=20",
    ]  # fmt: skip


def test_phase_cells_show_their_values_and_the_boundary_only_when_drawn(tmp_path):
    from nphcli.presentation.plot import plot_results

    single = phase_rows(trials=(0,))
    svg = plot_results(single, tmp_path / "p.svg", x="beta", y="noise").read_text()
    dense = [r for r in single if r["model"] == "dense"]
    for row in dense:  # every cell's value is written in it
        assert f"<!-- {row['success_mean']:.2g} -->" in svg
    assert "white line: success = 0.5" in svg
    for row in single:
        row["success_mean"] = 0.9
    svg = plot_results(single, tmp_path / "q.svg", x="beta", y="noise").read_text()
    assert "white line" not in svg and "<!-- 0.9 -->" in svg


def retrieve_json_rows():
    """`nph retrieve --model dense,sparse,topk --k 5 --beta 0.1,1 --mask 0.25,0.5 --json` rows,
    as read: no label, k empty for dense and sparse."""
    return [
        {"model": model, "k": 5 if model == "topk" else None, "beta": beta, "mask": mask,
         "M": 100, "sse_mean": beta + mask + len(model)}
        for model in ("dense", "sparse", "topk") for beta in (0.1, 1.0) for mask in (0.25, 0.5)
    ]  # fmt: skip


def test_facet_model_lines_name_their_own_model_and_k():
    """Each panel's lines are named from its own rows: topk's say topk and k=5 (they read
    `dense beta=0.1`, the first panel's names, before)."""
    data = curves(retrieve_json_rows(), x="mask", facet="model")
    assert {panel: sorted(lines) for panel, lines in data.panels.items()} == {
        "model=dense": ["dense beta=0.1", "dense beta=1"],
        "model=sparse": ["sparse beta=0.1", "sparse beta=1"],
        "model=topk": ["topk beta=0.1 k=5", "topk beta=1 k=5"],
    }


def test_a_whole_number_in_a_label_is_shown_as_an_integer():
    """A sweep's label keeps `k=10.0` (its key, for --resume); a line shows k=10."""
    rows = [
        {"label": "topk k=10.0", "model": "topk", "k": 10.0, "M": size, "sse_mean": 1.0}
        for size in (10, 20)
    ]
    rows += [dict(r, label="topk k=0.5", k=0.5) for r in rows]
    assert sorted(curves(rows, x="size").lines) == ["topk k=0.5", "topk k=10"]


@pytest.mark.parametrize("size", [(800, 500), (640, 400), (1000, 600)])
def test_the_title_never_overlaps_the_legend_or_another_text(size):
    """Measured by matplotlib's renderer: the long title of many fixed settings wraps left of
    the legend and inside the figure, at the default size and others."""
    pytest.importorskip("matplotlib")
    from nphcli.presentation.plot import overlapping_texts, phase_figure, results_figure

    fixed = {"memory": "a-long-memory-file-name.safetensors", "dataset": "mnist", "d": 784}
    fixed["memory_sha256"] = "8bb315c105f3f6ff6816c31c072e4b769b237bad31e22bde54a8f878fc8e1ad6"
    rows = [dict(row, **fixed) for row in retrieve_json_rows()]
    phase = [dict(r, success_mean=r["mask"]) for r in rows]
    for figure in (
        results_figure(rows, x="mask", size=size),
        results_figure(rows, x="mask", facet="model", size=size),
        phase_figure(phase, x="beta", y="mask", size=size),
    ):
        assert overlapping_texts(figure) == []
        heading = figure._suptitle.get_window_extent()
        assert heading.x1 <= 0.99 * figure.bbox.x1 and heading.y1 <= figure.bbox.y1


def test_the_boundary_runs_along_cell_edges():
    """Between a cell that succeeds (≥ 0.5) and its neighbour that does not, never a stub
    interpolated inside a cell; empty cells border nothing."""
    import numpy as np

    from nphcli.presentation.plot import boundary_edges

    wins = np.array([[0.2, 0.9], [0.1, 0.8]])  # (y, x): the right column succeeds
    assert boundary_edges(wins) == [[(0.5, -0.5), (0.5, 0.5)], [(0.5, 0.5), (0.5, 1.5)]]
    assert boundary_edges(np.array([[0.2, np.nan, 0.9]])) == []
    assert boundary_edges(np.array([[0.9], [0.1]])) == [[(-0.5, 0.5), (0.5, 0.5)]]
