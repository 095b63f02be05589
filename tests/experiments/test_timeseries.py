"""The time-series experiment on tiny synthetic CSV files: reading, refusing bad files, the
splits, the scaler, the windows, the network against a formula written out, training,
reproducibility and resume."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.core.errors import NphError
from nphcli.experiments import timeseries as ts
from nphcli.experiments import timeseries_config as tc
from nphcli.experiments import timeseries_run as tr
from nphcli.experiments.timeseries_model import TSNet, rules

TINY = tc.TSConfig(
    horizons=(4,),
    epochs=2,
    runs=1,
    split="ratio",
    batch_size=16,
    d_model=8,
    heads=2,
    variants=("dense", "window"),
)


def write_csv(path, values, *, start="2016-07-01 00:00:00", step_hours=1.0, extra=True):
    """A CSV in the ETT layout: date, one other column, OT."""
    t0 = datetime.fromisoformat(start)
    lines = ["date,HUFL,OT" if extra else "date,OT"]
    for i, v in enumerate(values):
        stamp = (t0 + timedelta(hours=step_hours * i)).isoformat(sep=" ")
        lines.append(f"{stamp},{i * 0.5},{v}" if extra else f"{stamp},{v}")
    path.write_text("\n".join(lines) + "\n")
    return path


def sine(n, period=12):
    return [math.sin(2 * math.pi * i / period) + 0.1 * math.cos(i) for i in range(n)]


def test_read_series_takes_the_target_column_the_step_and_the_hash(tmp_path):
    path = write_csv(tmp_path / "s.csv", [1.5, 2.0, -3.25, 4.0], step_hours=0.25)
    series = ts.read_series(path, "OT")
    assert series.values.tolist() == [1.5, 2.0, -3.25, 4.0]
    assert series.step_seconds == 900 and series.rows_per_day == 96
    other = ts.read_series(path, "HUFL")
    assert other.values.tolist() == [0.0, 0.5, 1.0, 1.5]
    assert len(series.sha256) == 64 and series.sha256 == other.sha256


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("date,HUFL,OT\n", ["no data rows"]),
        ("date,HUFL,LOAD\n2016-07-01 00:00:00,1,2\n", ["no column 'OT'", "HUFL, LOAD"]),
        ("date,HUFL,OT\n2016-07-01 00:00:00,1\n", ["line 2", "2 cells", "header has 3"]),
        (
            "date,HUFL,OT\n2016-07-01 00:00:00,1,2\n2016-07-01 01:00:00,x,3\n",
            ["line 3", "'HUFL'", "'x' is not a number"],
        ),
        ("date,HUFL,OT\n2016-07-01 00:00:00,1,nan\n", ["line 2", "'OT'", "not a number"]),
        ("date,HUFL,OT\nyesterday,1,2\n", ["line 2", "not a date"]),
        (
            "date,HUFL,OT\n2016-07-01 01:00:00,1,2\n2016-07-01 00:00:00,1,2\n",
            ["line 3", "must increase"],
        ),
    ],
)
def test_bad_files_are_refused_with_the_place(tmp_path, text, words):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(NphError) as error:
        ts.read_series(path, "OT")
    for word in words:
        assert word in str(error.value)


def test_a_missing_file_is_one_line(tmp_path):
    with pytest.raises(NphError, match="cannot read"):
        ts.read_series(tmp_path / "none.csv")


def test_months_split_is_informers_borders(tmp_path):
    """Hourly rows: 12 / 4 / 4 months of 30 days = 8640 / 2880 / 2880 rows; validation and test
    start L rows before their border; the rest of the file is unused."""
    n = 8640 + 2880 + 2880 + 100
    series = ts.Series(torch.zeros(n, dtype=torch.float64), 3600.0, "x", "OT", "0" * 64)
    borders = ts.split_borders(series, "months", 96)
    assert borders == {"train": (0, 8640), "val": (8544, 11520), "test": (11424, 14400)}
    quarter_hourly = replace(series, values=torch.zeros(4 * n), step_seconds=900.0)
    assert ts.split_borders(quarter_hourly, "months", 8)["test"] == (46072, 57600)
    with pytest.raises(NphError, match="--split ratio"):
        ts.split_borders(replace(series, values=torch.zeros(1000)), "months", 8)


def test_ratio_split_is_70_10_20():
    series = ts.Series(torch.zeros(1000, dtype=torch.float64), 600.0, "x", "OT", "0" * 64)
    assert ts.split_borders(series, "ratio", 10) == {
        "train": (0, 700),
        "val": (690, 800),
        "test": (790, 1000),
    }
    with pytest.raises(NphError, match="unknown split"):
        ts.split_borders(series, "weeks", 10)


def test_windows_against_a_loop():
    values = torch.arange(10, dtype=torch.float32) ** 2
    x, y = ts.windows(values, 3, 2)
    assert x.shape == (6, 3) and y.shape == (6, 2)
    for i in range(6):
        assert x[i].tolist() == [float(j * j) for j in range(i, i + 3)]
        assert y[i].tolist() == [float(j * j) for j in range(i + 3, i + 5)]
    with pytest.raises(NphError, match="fewer than input \\+ horizon = 6 \\+ 5"):
        ts.windows(values, 6, 5, "test")


def test_prepare_fits_the_scaler_on_the_training_rows_only(tmp_path):
    values = [float(i) for i in range(100)]
    series = ts.read_series(write_csv(tmp_path / "s.csv", values))
    data = ts.prepare(series, input_len=4, horizon=4, split="ratio")
    train = torch.tensor(values[:70], dtype=torch.float64)
    assert data.scaler.mean == pytest.approx(float(train.mean()))
    assert data.scaler.std == pytest.approx(float(train.std(unbiased=False)))
    x, y = data.parts["test"]
    assert x.shape == (100 - 76 - 8 + 1, 4)  # the test part starts L = 4 rows before row 80
    first = (torch.tensor([76.0, 77, 78, 79, 80, 81, 82, 83]) - data.scaler.mean) / data.scaler.std
    assert torch.allclose(torch.cat([x[0], y[0]]), first.float())
    short = ts.read_series(write_csv(tmp_path / "short.csv", values[:20]))
    with pytest.raises(NphError, match="the val part has 6 rows"):
        ts.prepare(short, input_len=4, horizon=4, split="ratio")


def test_rules_follow_the_paper_and_the_released_code():
    config = tc.PRESETS["paper"]
    by_label = {v.label: v for v in tc.VARIANTS}
    for horizon, size in ((96, 8), (192, 12), (336, 14), (720, 16), (500, 14), (24, 8)):
        layer, pool = rules(config, by_label["window"], horizon)
        assert (layer.name, layer.window, pool.name) == ("window", size, "sparse")
    layer, pool = rules(config, by_label["random-feature"], 96)
    assert layer.features == pool.features == int(16 * math.log(16)) == 44
    layer, pool = rules(config, by_label["topk-20%"], 96)
    assert (layer.name, layer.k, pool.k, layer.beta) == ("topk", 0.2, 0.2, 0.1)
    assert [v.label for v in tc.VARIANTS] == list(config.variants)


def _dense_reference(net: TSNet, x: torch.Tensor, beta: float) -> torch.Tensor:
    """TSNet with the dense rule, written out from the formulas: per head h,
    NPH(R) = W_O ⊕_h softmax(β R W_Q,h (R W_K,h)ᵀ) (R W_K) W_V,h."""
    layer, pool, heads = net.layer, net.pool, net.pool.heads

    def attend(q, keys, values):  # (B, N, H·dh), (B, M, H·dh), (B, M, H·dv)
        split = lambda t: t.unflatten(-1, (heads, -1)).transpose(1, 2)  # noqa: E731
        weights = torch.softmax(beta * split(q) @ split(keys).transpose(-1, -2), dim=-1)
        return (weights @ split(values)).transpose(1, 2).flatten(-2)

    h = net.norm_embed(x.unsqueeze(-1) * net.embed.weight[:, 0] + net.embed.bias)
    keys = h @ layer.key.weight.T + layer.key.bias
    out = attend(h @ layer.query.weight.T + layer.query.bias, keys, layer.value(keys))
    h = net.norm_layer(torch.nn.functional.gelu(layer.out(out)))
    prototype = pool.query(pool.prototypes)[None].expand(h.shape[0], -1, -1)  # (B, 1, H·dh)
    keys = h @ pool.key.weight.T + pool.key.bias
    pooled = pool.out(attend(prototype, keys, pool.value(keys)))[:, 0]
    return net.head(net.norm_pool(pooled))


def test_the_network_is_the_papers_architecture_written_out():
    net = tr.build_net(TINY, tc.VARIANTS[0], 5, seed=3).double().eval()  # eval: no dropout
    assert (net.layer.dropout, net.pool.dropout) == (0.2, 0.1)  # the released Dense's
    x = torch.randn(7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert net(x).shape == (7, 5)
    assert torch.allclose(net(x), _dense_reference(net, x, TINY.beta), atol=1e-10)


def test_evaluate_is_the_mean_over_every_predicted_value():
    net = tr.build_net(TINY, tc.VARIANTS[0], 4, seed=0).eval()
    x, y = torch.randn(37, 4), torch.randn(37, 4)
    with torch.no_grad():
        error = net(x) - y
    mse, mae = tr.evaluate(net, x, y, batch_size=5)
    assert mse == pytest.approx(float(error.square().mean()), rel=1e-5)
    assert mae == pytest.approx(float(error.abs().mean()), rel=1e-5)


def test_runs_are_set_beside_the_papers_cells():
    records = [
        {"model": "dense", "horizon": 96, "run": run, "test_mse": m, "test_mae": m / 2}
        for run, m in enumerate((0.1, 0.2, 0.3, 9.0))
    ] + [{"model": "dense", "horizon": 192, "run": 0, "test_mse": 9.0, "test_mae": 9.0}]
    # The grid's 3 runs at horizon 96: run 3 and horizon 192 are in the file but not compared.
    config = replace(tc.PRESETS["paper"], horizons=(96,), runs=3, variants=("dense", "window"))
    cells = tr.compare_with_paper(records, "ETTh1", config)
    assert [(c.row, c.column) for c in cells] == [
        ("dense", "ETTh1/96/MSE"),
        ("dense", "ETTh1/96/MAE"),
        ("window", "ETTh1/96/MSE"),
        ("window", "ETTh1/96/MAE"),
    ]
    mse = cells[0]
    assert (mse.paper, mse.seeds) == (0.137, 3) and mse.mean == pytest.approx(0.2)
    assert mse.std == pytest.approx(0.1)  # the sample spread of 0.1, 0.2, 0.3
    assert mse.difference == pytest.approx(0.063) and mse.within is True
    assert cells[1].mean == pytest.approx(0.1) and cells[1].within is False  # paper .307
    assert cells[2].paper == 1.043 and cells[2].mean is None and cells[2].within is None
    # Window's column is not comparable (a defect of the released code), run or not.
    assert [c.verdict for c in cells] == ["within", "outside", "not comparable", "not comparable"]
    # A data set the paper does not print (ETTh2) has an empty paper column and no verdict.
    other = tr.compare_with_paper(records, "ETTh2", config)
    assert [c.paper for c in other] == [None] * 4 and other[0].mean == pytest.approx(0.2)
    assert {c.verdict for c in other} == {None}


def test_trivial_baselines_are_rows_beside_the_models(tmp_path):
    data = write_csv(tmp_path / "ETTh1.csv", sine(400, period=100))
    series = ts.read_series(data)
    prepared = ts.prepare(series, input_len=4, horizon=4, split="ratio")
    x, y = prepared.parts["test"]
    last = float((x[:, -1:] - y).double().square().mean())
    errors = ts.baselines(prepared)
    assert errors["repeat-last"][0] == pytest.approx(last)
    # Least squares on 4 lags of a sine fits it (nearly) exactly; the others do not.
    assert errors["least-squares"][0] < 1e-6 < errors["input-mean"][0]
    config = replace(TINY, variants=("dense", "window"))
    records = [{"model": "window", "horizon": 4, "run": r, "test_mse": 1.0, "test_mae": 1.0}
               for r in range(2)]  # fmt: skip
    cells = tr.compare_with_paper(records, "ETTh1", config, series)
    baselines = ["repeat-last", "input-mean", "least-squares"]
    assert [c.row for c in cells[::2]] == ["dense", "window", *baselines]
    assert {c.verdict for c in cells[4:]} == {"baseline"}
    assert cells[2].reason is None  # no paper column at horizon 4: nothing to compare


def test_configure_overrides_and_refuses():
    config = tc.configure("paper", models="dense,window", horizons="96,720", runs=2)
    assert config.variants == ("dense", "window") and config.horizons == (96, 720)
    assert config.runs == 2 and config.epochs == 10
    for kwargs, words in (
        ({"models": "dense,bogus"}, "unknown model 'bogus'"),
        ({"horizons": "96,x"}, "whole numbers"),
        ({"horizons": "0"}, "≥ 1"),
        ({"epochs": 0}, "--epochs"),
        ({"split": "weeks"}, "months or ratio"),
    ):
        with pytest.raises(NphError, match=words):
            tc.configure("quick", **kwargs)
    with pytest.raises(NphError, match="preset"):
        tc.configure("huge")


# Training builds a torch optimiser, whose first use imports torch._dynamo (seconds): slow.
@pytest.mark.slow
def test_experiment_learns_selects_by_validation_reproduces_and_resumes(tmp_path):
    # A slow wave: the inputs' level tells the next values. (The network has no positional
    # encoding, as in the paper, so a fast wave's phase is not recoverable from a short input.)
    data = write_csv(tmp_path / "sine.csv", sine(400, period=100))
    config = replace(TINY, epochs=3, lr=1e-2)
    reference = tr.run_experiment(config, data, tmp_path / "ref.jsonl")
    assert [(r["model"], r["run"]) for r in reference] == [("dense", 0), ("window", 0)]
    for record in reference:
        vals = [e["val_mse"] for e in record["epochs"]]
        assert record["best_epoch"] == 1 + vals.index(min(vals))
        assert record["val_mse"] == min(vals)
        # Far better than predicting the mean (MSE about 1 on standardised values).
        assert record["test_mse"] < 0.5 and record["test_mae"] < record["test_mse"] ** 0.5 + 1e-9
        assert record["protocol"]["data"] == "sine.csv"
    with pytest.raises(NphError, match="already exists"):
        tr.run_experiment(config, data, tmp_path / "ref.jsonl")

    # A second run of the grid resumes: the first record is kept, the second retrained equal.
    partial = tmp_path / "part.jsonl"
    tr.write_results(partial, reference[:1])
    resumed = tr.run_experiment(config, data, partial, resume=True)
    assert [r["test_mse"] for r in resumed] == [r["test_mse"] for r in reference]
    assert tr.read_results(partial) == resumed
    with pytest.raises(NphError, match="another protocol"):
        tr.run_experiment(replace(config, clip=1.0), data, partial, resume=True)


@pytest.mark.slow
def test_cli_trains_compares_writes_and_resumes(tmp_path, invoke):
    data = write_csv(tmp_path / "series.csv", sine(2100, period=300))
    args = [
        "paper",
        "timeseries",
        str(data),
        "--dataset",
        "ETTh1",
        "--split",
        "ratio",
        "--models",
        "dense,window",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "res"),
        "--json",
    ]
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["table"] == "mts-result" and shown["summary"]["compared"] == 0  # one run each
    # dense's two cells have one seed; window's are not comparable (the released layer's defect)
    assert shown["summary"]["one_seed"] == 2 and shown["summary"]["not_comparable"] == 2
    cells = {(c["row"], c["column"]): c for c in shown["cells"]}
    assert cells["window", "ETTh1/96/MSE"]["paper"] == 1.043
    assert cells["window", "ETTh1/96/MSE"]["verdict"] == "not comparable"
    assert cells["dense", "ETTh1/96/MAE"]["seeds"] == 1
    for name in ("mts-result.json", "mts-result.csv", "mts-result.png", "timeseries-ETTh1.jsonl"):
        assert (tmp_path / "res" / name).stat().st_size > 0
    records = tr.read_results(tmp_path / "res" / "timeseries-ETTh1.jsonl")
    assert cells["dense", "ETTh1/96/MSE"]["mean"] == records[0]["test_mse"]
    again = invoke(*args)  # every run is in the folder already: nothing is retrained
    assert json.loads(again.stdout)["cells"] == shown["cells"]
    assert "0 training runs" in again.stderr
    table = invoke(*args, "--no-train")
    assert json.loads(table.stdout)["cells"] == shown["cells"]
    assert json.loads(table.stdout)["runs_compared"] == 2
    other = invoke(*args[:-1], "--no-train", "--epochs", "2")  # not the runs' protocol
    assert_one_error_line(other, "another protocol")


def test_no_train_needs_finished_runs(tmp_path, invoke):
    data = write_csv(tmp_path / "ETTh1.csv", sine(50))
    result = invoke("paper", "timeseries", str(data), "--out", str(tmp_path), "--no-train")
    assert_one_error_line(result, "holds no finished runs", "without --no-train")


@pytest.mark.parametrize(
    ("extra", "words"), [(["--models", "dense,bogus"], ["unknown model 'bogus'"])]
)
def test_cli_refuses_before_training(tmp_path, invoke, extra, words):
    data = write_csv(tmp_path / "ETTh1.csv", sine(50))
    result = invoke(*["paper", "timeseries", str(data), "--out", str(tmp_path / "r"), *extra])
    assert_one_error_line(result, *words)
    assert not (tmp_path / "r").exists()


def test_cli_bad_file_is_one_line(tmp_path, invoke):
    data = tmp_path / "ETTh1.csv"
    data.write_text("date,OT\n2016-07-01 00:00:00,1\n2016-07-01 01:00:00,?\n")
    result = invoke(*["paper", "timeseries", str(data), "--out", str(tmp_path / "r")])
    assert_one_error_line(result, "line 3", "'?' is not a number")
    (tmp_path / "short").mkdir()
    short = write_csv(tmp_path / "short" / "ETTh1.csv", sine(300))
    result = invoke(
        *["paper", "timeseries", str(short), "--split", "ratio", "--out", str(tmp_path / "r")]
    )
    assert_one_error_line(result, "fewer than input + horizon = 96 + 96")


@pytest.mark.slow
def test_epoch_times_time_every_model_and_scale_a_partial_epoch(tmp_path):
    """benchmarks/timeseries_epoch.py's timing (the paper's efficiency figure)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "timeseries_epoch.py"
    spec = importlib.util.spec_from_file_location("timeseries_epoch", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = write_csv(tmp_path / "s.csv", sine(400, period=100))
    rows = bench.epoch_times(TINY, data, steps=2, repeats=2)
    assert [(r["model"], r["horizon"]) for r in rows] == [("dense", 4), ("window", 4)]
    for r in rows:
        assert r["steps_per_epoch"] == math.ceil((280 - 8 + 1) / 16) and r["measured_steps"] == 2
        assert 0 < r["fastest_seconds_per_epoch"] <= r["seconds_per_epoch"]
        assert r["repeats"] == 2
    whole = bench.epoch_times(replace(TINY, variants=("dense",)), data)
    assert whole[0]["measured_steps"] == whole[0]["steps_per_epoch"]


@pytest.mark.slow
def test_cli_runs_a_data_set_the_paper_does_not_print(tmp_path, invoke):
    """ETTh2 (or any file in the layout): an empty paper column, the baselines beside."""
    data = write_csv(tmp_path / "ETTh2.csv", sine(400, period=100))
    out = tmp_path / "res"
    args = ["--models", "dense", "--horizons", "4", "--epochs", "1", "--out", str(out)]
    result = invoke("paper", "timeseries", str(data), *args, "--json", "--no-plot")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    rows = [(c["row"], c["column"]) for c in shown["cells"]][::2]
    assert rows == [
        ("dense", "ETTh2/4/MSE"),
        ("repeat-last", "ETTh2/4/MSE"),
        ("input-mean", "ETTh2/4/MSE"),
        ("least-squares", "ETTh2/4/MSE"),
    ]
    assert {c["paper"] for c in shown["cells"]} == {None}
    assert shown["summary"]["compared"] == 0 and (out / "timeseries-ETTh2.jsonl").exists()
