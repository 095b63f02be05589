"""nph sweep: grid expansion, seeds, results files, resume, presets and config files."""

from __future__ import annotations

import csv
import json
import sys

import numpy as np
import pytest
from conftest import assert_one_error_line

from nphcli.core.devices import canonical_device
from nphcli.core.errors import NphError
from nphcli.sweeps import config as sweep_config
from nphcli.sweeps.columns import ID_FIELDS
from nphcli.sweeps.grid import expand, memory_seed, run_seed
from nphcli.sweeps.results import read_results

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TINY = ("--model", "dense,topk", "--k", "0.5", "--sizes", "5,8", "--trials", "2", "--beta", "0.5")


def sweep(invoke, pool, out, *extra):
    return invoke("sweep", "--dataset", pool, *TINY, "--noise", "0.3", "--out", out, *extra)


def metrics_by_key(rows):
    return {
        (r["setting"], r["trial"]): (r["sse_mean"], r["success_mean"], r["memory_seed"])
        for r in rows
    }


def test_tiny_sweep_rows_and_fields(invoke, pool, tmp_path):
    out = tmp_path / "r.jsonl"
    result = sweep(invoke, pool, out, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2  # models × sizes × trials
    assert report["runs"] == {"total": 8, "ran": 8, "skipped": 0}
    assert {(r["label"], r["M"]) for r in rows} == {
        (label, m) for label in ("dense", "topk k=0.5") for m in (5, 8)
    }
    assert sorted({r["trial"] for r in rows}) == [0, 1]
    # The fields of `nph retrieve --csv`, plus the sweep's identifiers.
    memory = tmp_path / "m.safetensors"
    assert invoke("store", pool, "--out", memory).exit_code == 0
    retrieved = invoke("retrieve", "--memory", memory, "--csv")
    retrieve_columns = next(csv.reader([retrieved.stdout.splitlines()[0]]))
    assert list(rows[0]) == [*ID_FIELDS, *retrieve_columns, "drawn_sha256", "run_settings"]
    assert all(r["Q"] == r["M"] for r in rows)  # every stored pattern is a query
    summary = report["summary"]
    assert len(summary) == 4 and all(s["trials"] == 2 for s in summary)
    dense5 = [r["sse_mean"] for r in rows if r["label"] == "dense" and r["M"] == 5]
    assert summary[0]["metrics"]["sse"]["mean"] == pytest.approx(np.mean(dense5))
    assert summary[0]["metrics"]["sse"]["std"] == pytest.approx(np.std(dense5))


def test_sweep_on_the_test_device(invoke, pool, tmp_path, device):
    out = tmp_path / "r.jsonl"
    result = sweep(invoke, pool, out, "--device", str(device), "--theory")
    assert result.exit_code == 0, result.stderr
    rows = read_results(out).rows
    # Reports name the device with its index ("cuda" runs on, and is reported as, "cuda:0").
    assert len(rows) == 8 and {r["device"] for r in rows} == {str(canonical_device(device))}
    assert all(r["theory_query_holds"] == r["theory_in_support"] for r in rows)


def test_table_on_stdout_and_notices_on_stderr(invoke, pool, tmp_path):
    result = sweep(invoke, pool, tmp_path / "r.csv")
    assert result.exit_code == 0, result.stderr
    assert "Sweep summary" in result.stdout and "topk k=0.5" in result.stdout
    assert "Error" not in result.stderr
    rows = read_results(tmp_path / "r.csv").rows
    assert len(rows) == 8 and isinstance(rows[0]["sse_mean"], float)


def test_seeds_reproducible_and_shared_across_models(invoke, pool, tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert sweep(invoke, pool, first).exit_code == 0
    assert sweep(invoke, pool, second).exit_code == 0
    a, b = read_results(first).rows, read_results(second).rows
    assert metrics_by_key(a) == metrics_by_key(b)
    # One memory and one corruption per trial, whatever the model.
    for trial in (0, 1):
        seeds = {(r["memory_seed"], r["run_seed"]) for r in a if r["trial"] == trial}
        assert seeds == {(memory_seed(0, trial), run_seed(0, trial))}
    assert memory_seed(0, 0) != memory_seed(0, 1) != memory_seed(1, 1)
    other = tmp_path / "c.jsonl"
    assert sweep(invoke, pool, other, "--seed", "1").exit_code == 0
    assert metrics_by_key(read_results(other).rows) != metrics_by_key(a)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_resume_after_interruption(invoke, pool, tmp_path, suffix):
    complete = tmp_path / f"complete{suffix}"
    assert sweep(invoke, pool, complete).exit_code == 0
    lines = complete.read_text().splitlines(keepends=True)
    kept = 4 if suffix == ".jsonl" else 5  # CSV: the header and 4 rows
    cut = tmp_path / f"cut{suffix}"
    cut.write_text("".join(lines[:kept]) + lines[kept][: len(lines[kept]) // 2])  # killed mid-row
    result = sweep(invoke, pool, cut, "--resume")
    assert result.exit_code == 0, result.stderr
    assert "4 of 8 runs are already" in result.stderr
    assert "cut-short last line" in result.stderr
    rows = read_results(cut)
    assert not rows.dropped
    keys = [(r["setting"], r["trial"]) for r in rows.rows]
    assert len(keys) == len(set(keys)) == 8  # every row exactly once
    assert metrics_by_key(rows.rows) == metrics_by_key(read_results(complete).rows)
    again = sweep(invoke, pool, cut, "--resume")  # nothing left to do
    assert again.exit_code == 0 and "all 8 runs are already" in again.stderr
    assert len(read_results(cut).rows) == 8


def test_existing_results_need_resume_or_force(invoke, pool, tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("precious\n")
    result = sweep(invoke, pool, out)
    line = assert_one_error_line(result)
    assert (
        line
        == f"Error: {out} already exists; pass --resume to continue it or --force to replace it"
    )
    assert out.read_text() == "precious\n"
    assert sweep(invoke, pool, out, "--force").exit_code == 0
    assert len(read_results(out).rows) == 8
    assert not (tmp_path / "r.partial.jsonl").exists()


def test_interrupted_force_keeps_the_old_file(invoke, pool, tmp_path, monkeypatch):
    import nphcli.evaluation.evaluate as retrieval

    out = tmp_path / "r.jsonl"
    out.write_text('{"old": 1}\n')
    real = retrieval.evaluate
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) > 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(retrieval, "evaluate", interrupted)
    result = sweep(invoke, pool, out, "--force")
    assert result.exit_code == 130
    assert out.read_text() == '{"old": 1}\n'
    partial = tmp_path / "r.partial.jsonl"
    assert len(read_results(partial).rows) == 3
    assert "r.partial.jsonl" in result.stderr


def test_resume_refuses_another_sweep(invoke, pool, tmp_path):
    out = tmp_path / "r.jsonl"
    assert sweep(invoke, pool, out).exit_code == 0
    result = sweep(invoke, pool, out, "--resume", "--seed", "3")
    assert_one_error_line(result, "another sweep")
    assert_one_error_line(sweep(invoke, pool, out, "--resume", "--theory"), "without --theory")


def test_damaged_middle_line_is_an_error(pool, tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"setting": "a", "trial": 0}\nnot json\n{"setting": "b", "trial": 0}\n')
    with pytest.raises(NphError, match="line 2"):
        read_results(out)


def test_sizes_beyond_the_data_are_refused_before_work(invoke, pool, tmp_path):
    result = invoke("sweep", "--dataset", pool, "--sizes", "50", "--out", tmp_path / "r.jsonl")
    assert_one_error_line(result, "exceeds the 40 patterns")
    assert not (tmp_path / "r.jsonl").exists()


def test_bundled_cifar10_limits_sizes(invoke, tmp_path):
    result = invoke(
        "sweep", "--preset", "paper-mask", "--dataset", "cifar10", "--out", tmp_path / "r.jsonl"
    )
    # the fallback's note comes first on stderr, then the error
    assert result.exit_code == 2 and result.stderr.strip().splitlines()[-1].startswith("Error:")
    assert "exceeds the 20 patterns of cifar10 (the offline fallback sample)" in result.stderr


@pytest.mark.parametrize("name", ["paper-mask", "paper-noise"])
def test_presets_parse(name):
    data, origin = sweep_config.load(preset=name)
    mnist = sweep_config.resolve(data, origin, {})
    cifar = sweep_config.resolve(data, origin, {"dataset": "cifar10"})
    assert (mnist.dataset, mnist.values["beta"], mnist.trials) == ("mnist", [0.01], 50)
    assert (cifar.dataset, cifar.values["beta"]) == ("cifar10", [0.1])
    labels = [s.label for s in expand(mnist) if s.size == mnist.sizes[0]]
    labels = labels[: len(labels) // (len(mnist.values["noise"]) * len(mnist.values["mask"]))]
    assert labels == [
        "dense",
        "sparse",
        "topk k=0.2",
        "topk k=0.5",
        "topk k=0.8",
        "random k=0.2",
        "random k=0.5",
        "random k=0.8",
        "window window=5",
        "linear",
        "random-feature features=256",
    ]
    if name == "paper-mask":
        assert (mnist.values["mask"], mnist.sizes[0], mnist.sizes[-1]) == ([0.5], 10, 200)
    else:
        assert mnist.sizes == [100]
        assert mnist.noise_variance[0] == 0.1 and mnist.noise_variance[-1] == 1.4
        assert mnist.values["noise"] == pytest.approx([v**0.5 for v in mnist.noise_variance])


def test_print_config_round_trips(invoke, tmp_path):
    result = invoke("sweep", "--preset", "paper-noise", "--print-config")
    assert result.exit_code == 0
    assert tomllib.loads(result.stdout)["noise_variance"][-1] == 1.4
    config = tmp_path / "mine.toml"
    config.write_text(result.stdout)
    data, origin = sweep_config.load(config=config)
    grid = sweep_config.resolve(data, origin, {"trials": 3, "sizes": [20]})
    assert (grid.trials, grid.sizes, grid.origin) == (3, [20], str(config))


def test_config_file_and_option_precedence(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(
        'dataset = "random"\nsizes = [4]\nbeta = [2.0]\nnoise = [0.1]\n'
        "[datasets.mnist]\nbeta = [0.5]\n"
        '[[models]]\nname = "random"\nk = [2, 3]\nseed = 7\n'
    )
    data, origin = sweep_config.load(config=path)
    grid = sweep_config.resolve(data, origin, {})
    assert (grid.dataset, grid.values["beta"], grid.values["noise"]) == ("random", [2.0], [0.1])
    assert grid.models[0].settings() == [{"k": 2.0, "seed": 7}, {"k": 3.0, "seed": 7}]
    on_mnist = sweep_config.resolve(data, origin, {"dataset": "mnist", "noise": [0.0]})
    assert (on_mnist.values["beta"], on_mnist.values["noise"]) == ([0.5], [0.0])
    by_option = sweep_config.resolve(data, origin, {"dataset": "mnist", "beta": [1.0]})
    assert by_option.values["beta"] == [1.0]
    by_option = sweep_config.resolve(data, origin, {"k": [5.0]})  # replaces the table's k
    assert by_option.models[0].settings() == [{"seed": 7}]
    assert [s.label for s in expand(by_option)] == ["random k=5.0 seed=7"]


def test_beta_is_a_model_parameter_in_a_table_or_for_every_model():
    data = sweep_config.parse(
        'beta = [0.5]\nmask = [0.0, 0.5]\n[[models]]\nname = "dense"\nbeta = [1.0, 2.0]\n'
        '[[models]]\nname = "topk"\nk = 2\n',
        "t",
    )
    keys = [s.key for s in expand(sweep_config.resolve(data, "t", {}))]
    assert keys == [
        f"{label} | M=100 | mask={mask} default | noise=0.0 | beta={beta}"
        for mask in (0.0, 0.5)
        for label, beta in (("dense", 1.0), ("dense", 2.0), ("topk k=2.0", 0.5))
    ]


def test_other_fields_take_lists_and_vary_in_the_label(invoke, pool, tmp_path):
    out = tmp_path / "r.jsonl"
    result = invoke(
        "sweep", "--dataset", pool, "--sizes", "5", "--mask", "0.5", "--fill", "0,0.5",
        "--dtype", "float64", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = read_results(out).rows
    assert [(r["label"], r["fill"], r["dtype"]) for r in rows] == [
        ("dense fill=0.0", 0.0, "float64"),
        ("dense fill=0.5", 0.5, "float64"),
    ]
    assert rows[0]["sse_mean"] != rows[1]["sse_mean"]


def test_sweep_and_retrieve_options_agree():
    """One declaration: the options a sweep shares with retrieve have the same type, default
    and help."""
    from typer.main import get_command

    from nphcli.cli import app

    commands = get_command(app).commands
    options = {name: {p.name: p for p in commands[name].params} for name in ("retrieve", "sweep")}
    for name in ("device", "dtype", "mask_mode", "noise_clip", "mask", "noise", "k", "beta"):
        sweep, retrieve = options["sweep"][name], options["retrieve"][name]
        described = [(p.opts, p.default, p.is_flag, p.metavar, p.help) for p in (sweep, retrieve)]
        assert described[0] == described[1], name
    assert "memory" not in options["sweep"] and "out" in options["sweep"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--preset", "paper-nope"),
            "unknown preset 'paper-nope'; choose one of: baselines, paper-mask",
        ),
        (("--model", "dense,hopscotch"), "unknown model 'hopscotch'"),
        (("--model", "dense", "--k", "3"), "no model of the grid (dense) takes 'k'"),
        (("--model", "topk", "--k", "-1"), "--k must be"),
        (("--sizes", "10,x"), "--sizes takes a whole number"),
        (("--seed", "1,2"), "a sweep takes one seed"),
        (("--dtype", "float8"), "--dtype must be one of"),
        (("--models", "dense,topk:k=0.5"), "--models is gone: name the models with --model"),
        (("--preset", "paper-mask", "--config", "x.toml"), "choose one of --preset and --config"),
        (("--out", "r.txt"), "use a .jsonl (JSON Lines) or .csv name"),
    ],
)
def test_bad_options_are_one_line_errors(invoke, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    assert_one_error_line(invoke("sweep", *args), message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sizez = [10]\n", "unknown key 'sizez'"),
        ('[datasets.mnist]\nmodels = "dense"\n', "[datasets.mnist]: unknown key 'models'"),
        ('[[models]]\nname = "nope"\n', "unknown model 'nope'"),
        ('[[models]]\nname = "dense"\nk = 1.0\n', "model 'dense' has no parameter 'k'"),
        ('out = "x.npz"\n', "does not take 'out': a sweep writes one row per run"),
        ('memory = "m.safetensors"\n', "does not take 'memory': a sweep draws its memories"),
        ("noise = [0.1, -1]\n", "--noise must be a standard deviation ≥ 0"),
        ('model = ["dense"]\n[[models]]\nname = "topk"\n', "not both"),
        ("noise = [0.1]\nnoise_variance = [0.1]\n", "not both"),
        ("sizes = [0]\n", "sizes must be a whole number ≥ 1"),
        ("trials = 1.5\n", "trials must be a whole number"),
        ("sizes = [\n", "not valid TOML"),
    ],
)
def test_bad_config_files_are_one_line_errors(invoke, tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert_one_error_line(invoke("sweep", "--config", path, "--out", tmp_path / "r.jsonl"), message)


def test_theory_fields(invoke, pool, tmp_path):
    out = tmp_path / "r.jsonl"
    result = invoke(
        "sweep",
        "--dataset",
        pool,
        "--model",
        "dense,topk,linear",
        "--k",
        "0.5",
        "--sizes",
        "6",
        "--beta",
        "0.5",
        "--out",
        out,
        "--theory",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    rows = {r["label"]: r for r in read_results(out).rows}
    clean = rows["dense"]  # clean queries: every x = ξ_μ lies in its sphere
    assert clean["theory_premises"] == clean["theory_in_support"] == 6
    assert clean["theory_stated_holds_premises"] == 6 and clean["theory_query_holds"] == 6
    assert rows["topk k=0.5"]["theory_corollary_holds"] is not None
    assert rows["linear"]["theory_premises"] is None  # not a sparse-structured model
    assert rows["linear"]["theory_m"] == pytest.approx(clean["theory_m"])
    summary = json.loads(result.stdout)["summary"]
    assert summary[0]["theory"]["premises"] == 6


def test_baselines_preset_puts_nearest_beside_the_hopfield_models():
    data, origin = sweep_config.load(preset="baselines")
    mnist = sweep_config.resolve(data, origin, {})
    assert (mnist.values["mask"], mnist.values["beta"], mnist.sizes[-1]) == ([0.5], [0.01], 200)
    labels = {s.label for s in expand(mnist) if s.size == mnist.sizes[0]}
    assert {"nearest metric=euclidean", "nearest metric=cosine", "dense", "sparse"} <= labels
