"""`nph retrieve` end to end on the bundled real MNIST digits, and its library `evaluate`."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, real_valued_models, write_memory
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from nphcli.core.defaults import DEFAULT_BETA
from nphcli.evaluation.corruption import Corruption
from nphcli.evaluation.evaluate import evaluate
from nphcli.evaluation.inputs import read_rows
from nphcli.memory.file import Memory, load_memory
from nphcli.models import get_model_info, model_names
from nphcli.schema.settings import RetrieveSettings

MODELS_WITH = {
    flag: [name for name in model_names() if flag in {p.name for p in get_model_info(name).params}]
    for flag in ("k", "window")
}


def _store(folder, name: str, *extra: str):
    from nphcli.cli import app

    path = folder / name
    result = CliRunner().invoke(app, ["store", "mnist", "--n", "100", "--out", str(path), *extra])
    assert result.exit_code == 0, result.stderr
    return path


@pytest.fixture(scope="session")
def mnist_centered(tmp_path_factory):
    """The same digits stored with --normalize centered (pixels in [−0.5, 0.5]): the stored
    pattern is then the one with the largest inner product with itself, so exact recall holds."""
    return _store(
        tmp_path_factory.mktemp("centered"), "memory.safetensors", "--normalize", "centered"
    )


@pytest.fixture
def retrieve(invoke, device):
    """Run `nph retrieve` on the test device; returns click's Result."""

    def run(*args: str):
        return invoke("retrieve", "--device", str(device), *args)

    return run


def _json(result) -> dict:
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, "stdout must carry exactly one JSON object"
    return json.loads(lines[0])


# -- every registered model, three output formats -------------------------------------------


@pytest.mark.parametrize("model", real_valued_models())
def test_every_model_table_json_csv(retrieve, mnist, model):
    common = ["--memory", mnist, "--model", model, "--queries", "10", "--mask", "0.5"]
    table = retrieve(*common)
    assert table.exit_code == 0, table.stderr
    for word in ("Run", "Metrics", "Timing", "success", "sse", model):
        assert word in table.stdout

    data = _json(retrieve(*common, "--json"))
    config, metrics, timing = data["config"], data["metrics"], data["timing"]
    assert config["model"] == model
    assert config["memory"]["M"] == 100 and config["memory"]["d"] == 784
    assert config["memory"]["file"] == str(mnist)
    assert config["queries"]["Q"] == 10 and config["seed"] == 0
    assert config["corruption"] == {"mask": 0.5, "mask_mode": "bottom", "fill": 0.0, "noise": 0.0}
    assert config["params"].get("beta", DEFAULT_BETA) == DEFAULT_BETA  # nearest takes no β
    assert 0 <= metrics["success"]["mean"] <= 1 and metrics["success"]["median"] in (0, 0.5, 1)
    assert metrics["sse"]["mean"] >= 0 and metrics["sse"]["std"] >= 0
    assert metrics["mse"]["mean"] == pytest.approx(metrics["sse"]["mean"] / 784)
    assert -1 <= metrics["cosine"]["mean"] <= 1
    assert metrics["steps"]["mean"] == 1
    if metrics["support"] is not None:
        assert 1 <= metrics["support"]["mean"] <= 100
    assert all(timing[key] >= 0 for key in timing)
    assert timing["retrieve_min_s"] <= timing["retrieve_median_s"] <= timing["total_s"]
    assert timing["us_per_query"] == pytest.approx(timing["retrieve_median_s"] / 10 * 1e6)

    result = retrieve(*common, "--csv")
    assert result.exit_code == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 1
    assert rows[0]["model"] == model and rows[0]["M"] == "100"
    assert float(rows[0]["success_mean"]) == metrics["success"]["mean"]


def test_csv_columns_are_the_same_for_every_model_and_no_header_appends(retrieve, mnist):
    headers = set()
    for model in real_valued_models():
        result = retrieve("--memory", mnist, "--model", model, "--queries", "3", "--csv")
        headers.add(result.stdout.splitlines()[0])
    assert len(headers) == 1
    result = retrieve("--memory", mnist, "--queries", "3", "--csv", "--no-header")
    assert result.exit_code == 0
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    assert len(next(csv.reader(lines))) == len(next(csv.reader([headers.pop()])))


# -- retrieval quality on the real digits ---------------------------------------------------


@pytest.mark.parametrize("model", ["dense", "topk", "sparse"])
def test_exact_recall_without_corruption(retrieve, mnist_centered, model):
    data = _json(retrieve("--memory", mnist_centered, "--model", model, "--json"))
    assert data["metrics"]["success"]["mean"] == 1.0


def test_half_masked_json_equals_the_library(retrieve, mnist, device):
    data = _json(retrieve("--memory", mnist, "--model", "dense", "--mask", "0.5", "--json"))
    assert data["metrics"]["success"]["mean"] > 0.5  # chance is 1/100
    settings = RetrieveSettings(model="dense", corruption=Corruption(mask=0.5), device=str(device))
    report = evaluate(load_memory(mnist), settings)
    assert data["metrics"] == json.loads(json.dumps(report.metrics))


def test_topk_under_noise_is_well_above_chance(retrieve, mnist):
    args = ["--memory", mnist, "--model", "topk", "--k", "10", "--noise", "0.5", "--json"]
    data = _json(retrieve(*args))
    assert data["metrics"]["success"]["mean"] > 0.5  # chance is 1/100
    assert data["config"]["params"]["k"] == 10


def test_same_seed_same_result_other_seed_other_queries(retrieve, mnist, tmp_path):
    runs = []
    for seed, name in ((1, "a"), (1, "b"), (2, "c")):
        out = tmp_path / f"{name}.safetensors"
        args = ["--memory", mnist, "--queries", "20", "--mask", "0.3", "--mask-mode", "random"]
        data = _json(retrieve(*args, "--noise", "0.2", "--seed", seed, "--out", out, "--json"))
        with safe_open(str(out), "pt") as f:
            runs.append((data["metrics"], f.get_tensor("queries"), f.get_tensor("query_row")))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[0][2], runs[2][2])  # other stored patterns drawn


def test_results_do_not_depend_on_the_batch_size(retrieve, mnist):
    args = ["--memory", mnist, "--mask", "0.5", "--per-query", "--json"]
    whole = _json(retrieve(*args))
    batched = _json(retrieve(*args, "--batch-size", "7"))
    assert batched["config"]["batch_size"] == 7
    assert whole["per_query"]["nearest"] == batched["per_query"]["nearest"]
    assert np.allclose(whole["per_query"]["sse"], batched["per_query"]["sse"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", MODELS_WITH["window"][:1])
def test_window_is_centred_on_the_querys_own_pattern(mnist, model, device):
    """Self-evaluation passes each query its stored index as position: with w = 0 the window
    holds only the target, so even a fully masked query retrieves it."""
    settings = RetrieveSettings(
        model=model,
        params={"window": 0},
        corruption=Corruption(mask=1.0),
        queries=17,
        seed=3,
        device=str(device),
        batch_size=5,
    )
    report = evaluate(load_memory(mnist), settings)
    assert report.metrics["success"]["mean"] == 1.0
    assert torch.equal(report.per_query["nearest"], report.per_query["query_row"])


def test_repeat_reports_min_and_median(retrieve, mnist):
    timing = _json(retrieve("--memory", mnist, "--queries", "5", "--repeat", "3", "--json"))[
        "timing"
    ]
    assert 0 < timing["retrieve_min_s"] <= timing["retrieve_median_s"]


def test_per_query_values(retrieve, mnist):
    data = _json(
        retrieve("--memory", mnist, "--queries", "6", "--noise", "0.1", "--per-query", "--json")
    )
    per = data["per_query"]
    assert len(per["sse"]) == 6 and per["query_row"] == sorted(per["query_row"])
    assert per["target_index"] == per["query_row"]
    assert [float(a == b) for a, b in zip(per["nearest"], per["target_index"], strict=True)] == per[
        "success"
    ]
    assert np.mean(per["sse"]) == pytest.approx(data["metrics"]["sse"]["mean"])
    rows = list(
        csv.DictReader(
            io.StringIO(
                retrieve("--memory", mnist, "--queries", "6", "--per-query", "--csv").stdout
            )
        )
    )
    assert len(rows) == 6 and {"query", "sse", "nearest", "success"} <= set(rows[0])


def test_hetero_associative_target_is_the_value_row(device):
    """Keys are noisy copies, values the clean patterns: the target is the value row."""
    g = torch.Generator().manual_seed(0)
    values = torch.nn.functional.normalize(torch.randn(30, 16, generator=g), dim=1)
    keys = values + 0.01 * torch.randn(30, 16, generator=g)
    report = evaluate(
        Memory(patterns=keys, values=values),
        RetrieveSettings(params={"beta": 50.0}, device=str(device)),
    )
    assert report.config["memory"]["hetero"] is True
    assert torch.equal(report.targets, values)
    assert report.metrics["success"]["mean"] == 1.0


# -- own queries ----------------------------------------------------------------------------


def _write(path, array: np.ndarray) -> None:
    suffix = path.suffix
    if suffix == ".npy":
        np.save(path, array)
    elif suffix == ".npz":
        np.savez(path, queries=array)
    elif suffix == ".csv":
        np.savetxt(
            path,
            array,
            delimiter=",",
            header=",".join(f"p{i}" for i in range(array.shape[1])),
            comments="",
        )
    else:
        save_file({"x": torch.from_numpy(array).contiguous()}, str(path))


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".csv", ".safetensors"])
def test_own_queries_with_targets(retrieve, mnist, tmp_path, suffix):
    stored = load_memory(mnist).patterns
    rows = [4, 9, 42, 77]
    queries = (stored[rows] * torch.linspace(0.5, 1.0, 784)).numpy().astype(np.float32)
    path = tmp_path / f"q{suffix}"
    _write(path, queries)
    targets = tmp_path / "t.npy"
    np.save(targets, stored[rows].numpy())

    by_file = _json(
        retrieve(
            "--memory",
            mnist,
            "--queries-file",
            path,
            "--targets-file",
            targets,
            "--per-query",
            "--json",
        )
    )
    by_index = _json(
        retrieve(
            "--memory",
            mnist,
            "--queries-file",
            path,
            "--target-indices",
            "4,9,42,77",
            "--per-query",
            "--json",
        )
    )
    listed = tmp_path / "targets.txt"
    listed.write_text("4\n9, 42\n77\n")  # @FILE: commas, spaces or one a line
    from_file = _json(
        retrieve(
            "--memory",
            mnist,
            "--queries-file",
            path,
            "--target-indices",
            f"@{listed}",
            "--per-query",
            "--json",
        )
    )
    assert from_file["per_query"] == by_index["per_query"]
    for data in (by_file, by_index):
        assert data["config"]["queries"]["source"] == "file" and data["config"]["queries"]["Q"] == 4
        assert data["per_query"]["target_index"] == rows
        assert data["per_query"]["query_row"] == [0, 1, 2, 3]
    assert by_file["metrics"] == by_index["metrics"]

    report = evaluate(
        load_memory(mnist),
        RetrieveSettings(device=by_file["config"]["device"]),
        queries=torch.from_numpy(queries),
        target_indices=torch.tensor(rows),
    )
    assert by_file["metrics"] == json.loads(json.dumps(report.metrics))


@pytest.mark.parametrize("fixture", ["mnist", "mnist_centered"])
def test_pixel_queries_are_normalised_like_the_memory(request, tmp_path, fixture):
    memory = load_memory(request.getfixturevalue(fixture))
    rows = [0, 3, 99]
    path = tmp_path / "digits.npy"
    stored = memory.patterns[rows]
    offset = 0.5 if fixture == "mnist_centered" else 0.0
    np.save(path, ((stored + offset) * 255).round().to(torch.uint8).view(3, 28, 28).numpy())
    assert torch.allclose(read_rows(path, "queries", memory), stored, atol=1e-6)


def test_own_queries_without_targets(retrieve, mnist, tmp_path):
    stored = load_memory(mnist).patterns
    path = tmp_path / "q.npy"
    np.save(path, stored[[5, 6]].numpy())
    data = _json(
        retrieve(
            "--memory",
            mnist,
            "--queries-file",
            path,
            "--model",
            "sparse",
            "--beta",
            "1",
            "--per-query",
            "--json",
        )
    )
    metrics = data["metrics"]
    assert metrics["success"] is None and metrics["sse"] is None and metrics["cosine"] is None
    assert metrics["nearest_distance"]["mean"] >= 0
    assert metrics["support"]["mean"] >= 1
    assert set(data["per_query"]) == {
        "query_row",
        "nearest",
        "nearest_distance",
        "support",
        "steps",
    }
    table = retrieve("--memory", mnist, "--queries-file", path)
    assert table.exit_code == 0 and "no targets" in table.stdout


def test_out_file_contents(retrieve, mnist, tmp_path):
    out = tmp_path / "results.safetensors"
    data = _json(
        retrieve(
            "--memory",
            mnist,
            "--queries",
            "8",
            "--mask",
            "0.5",
            "--out",
            out,
            "--per-query",
            "--json",
        )
    )
    with safe_open(str(out), "pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
        meta = f.metadata()
    assert set(tensors) == {"retrieved", "nearest", "queries", "query_row", "target_index"}
    assert tensors["retrieved"].shape == (8, 784) and tensors["queries"].shape == (8, 784)
    assert tensors["nearest"].dtype == torch.int64
    assert tensors["nearest"].tolist() == data["per_query"]["nearest"]
    assert tensors["query_row"].tolist() == data["per_query"]["query_row"]
    stored = load_memory(mnist).patterns[tensors["query_row"]]
    images = tensors["queries"].view(8, 28, 28)
    assert torch.all(images[:, 14:] == 0)  # bottom half hidden, fill 0
    assert torch.equal(images[:, :14], stored.view(8, 28, 28)[:, :14])
    assert json.loads(meta["config"]) == data["config"]

    before = out.read_bytes()
    assert_one_error_line(retrieve("--memory", mnist, "--out", out), "--force")
    assert out.read_bytes() == before
    assert retrieve("--memory", mnist, "--queries", "2", "--out", out, "--force").exit_code == 0
    assert_one_error_line(retrieve("--memory", mnist, "--out", mnist, "--force"), "input")


# -- the picture ----------------------------------------------------------------------------


@pytest.mark.parametrize(("queries", "columns"), [(None, 8), ("3", 3)])
def test_grid_png_size_and_rows(retrieve, mnist, tmp_path, queries, columns):
    path = tmp_path / "grid.png"
    args = ["--memory", mnist, "--mask", "0.5", "--save-grid", path]
    result = retrieve(*args, *(("--queries", queries) if queries else ()))
    assert result.exit_code == 0, result.stderr
    labelled = np.asarray(Image.open(path))
    # 2 × (n·28 + (n + 1)·2) wide, 2 × (3·28 + 4·2) high: three rows of 28-pixel digits, then
    # a margin naming the rows
    width = 2 * (columns * 28 + (columns + 1) * 2)
    assert labelled.shape[0] == 2 * (3 * 28 + 4 * 2) and labelled.shape[1] > width
    image = labelled[:, :width]
    gutter = round(0.5 * 255)
    row_tops = [2 * (2 + r * 30) for r in range(3)]
    for top in row_tops:  # gutters above and below each row of cells
        assert np.all(image[top - 4 : top, :] == gutter)
        assert np.all(image[top + 56 : top + 60, :] == gutter)
        cells = image[top : top + 56, 4:8]
        assert not np.all(cells == gutter)  # a digit cell starts here (black background)
    first_query = image[row_tops[0] : row_tops[0] + 56, 4:60]
    assert first_query[28:].max() == 0  # its bottom half is masked (fill 0 → black)
    target = image[row_tops[2] : row_tops[2] + 56, 4:60]
    assert target[28:].max() > 0


def test_grid_needs_images(retrieve, tmp_path):
    path = tmp_path / "vectors.safetensors"
    write_memory(path, torch.rand(10, 6))
    assert_one_error_line(retrieve("--memory", path, "--save-grid", tmp_path / "g.png"), "image")
    assert not (tmp_path / "g.png").exists()


# -- errors ---------------------------------------------------------------------------------


def _model_without(flag: str) -> str:
    return next(n for n in model_names() if flag not in {p.name for p in get_model_info(n).params})


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--model", "no-such-model"], ["no-such-model", "nph models"]),
        (["--model", _model_without("k"), "--k", "5"], ["--k"]),
        (["--mask", "1.5"], ["--mask"]),
        (["--noise", "-1"], ["--noise"]),
        (["--mask-mode", "middle", "--mask", "0.5"], ["--mask-mode"]),
        (["--device", "tpu"], ["unknown device"]),
        (["--device", "cuda:99"], ["cuda:99"]),
        (["--dtype", "int8"], ["dtype"]),
        (["--queries", "0"], ["--queries"]),
        (["--queries", "101"], ["--queries"]),
        # `--json --csv` fails as a JSON object (under --json): tests/cli/test_cli_conventions.py
        (["--no-header"], ["--csv"]),
        (["--target-indices", "1,2"], ["--queries-file"]),
        (["--target-indices", "a,b"], ["--target-indices"]),
    ],
)
def test_user_errors_are_one_line_exit_2(retrieve, mnist, args, words):
    assert_one_error_line(retrieve("--memory", mnist, *args), *words)


@pytest.mark.parametrize("k", ["0", "101", "2.5", "-0.5"])
def test_k_out_of_range(retrieve, mnist, k):
    assert MODELS_WITH["k"], "a model that takes --k (topk, random) is missing from the registry"
    assert_one_error_line(
        retrieve("--memory", mnist, "--model", MODELS_WITH["k"][0], "--k", k), "--k"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_cuda_without_cuda(invoke, mnist):
    assert_one_error_line(invoke("retrieve", "--memory", mnist, "--device", "cuda"), "CUDA")


def test_missing_memory_file(retrieve, tmp_path):
    assert_one_error_line(
        retrieve("--memory", tmp_path / "nope.safetensors"), "not found", "nph store"
    )


def test_queries_of_the_wrong_dimension(retrieve, mnist, tmp_path):
    path = tmp_path / "q.npy"
    np.save(path, np.zeros((3, 783), dtype=np.float32))
    assert_one_error_line(retrieve("--memory", mnist, "--queries-file", path), "784")


def test_targets_count_must_match(retrieve, mnist, tmp_path):
    np.save(tmp_path / "q.npy", np.zeros((3, 784), dtype=np.float32))
    np.save(tmp_path / "t.npy", np.zeros((2, 784), dtype=np.float32))
    args = ["--queries-file", tmp_path / "q.npy", "--targets-file", tmp_path / "t.npy"]
    assert_one_error_line(retrieve("--memory", mnist, *args), "2 targets for 3 queries")


def test_help_states_the_default_beta(invoke):
    result = invoke("retrieve", "--help")
    assert f"default: {DEFAULT_BETA}" in " ".join(result.stdout.split())


def test_default_beta_notice_for_unit_norm_patterns(retrieve, tmp_path):
    path = tmp_path / "l2.safetensors"
    x = torch.rand(20, 50)
    write_memory(path, x / x.norm(dim=1, keepdim=True))
    result = retrieve("--memory", path, "--json")
    assert result.exit_code == 0
    assert "--beta" in result.stderr and "consider" in result.stderr
    json.loads(result.stdout)  # the notice stays off stdout


# -- CUDA -----------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cuda_agrees_with_cpu(invoke, mnist, dtype):
    args = [
        "retrieve",
        "--memory",
        mnist,
        "--mask",
        "0.5",
        "--dtype",
        dtype,
        "--per-query",
        "--json",
    ]
    cpu = _json(invoke(*args, "--device", "cpu"))
    gpu = _json(invoke(*args, "--device", "cuda"))
    assert gpu["config"]["device"].startswith("cuda")
    agree = np.mean(np.equal(cpu["per_query"]["nearest"], gpu["per_query"]["nearest"]))
    assert agree >= (1.0 if dtype == "float32" else 0.95)
