"""`nph retrieve --stream` and `--memory-budget`: same results as the in-memory default run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, real_valued_models, write_memory
from PIL import Image

from nphcli.evaluation import metrics
from nphcli.memory.bank import TensorBank
from nphcli.memory.streamed import StreamedBank
from nphcli.schema.option import parse_size


@pytest.fixture(scope="module")
def hetero(tmp_path_factory):
    """Hetero-associative memory: noisy keys (40, 12), clean values (40, 5)."""
    g = torch.Generator().manual_seed(1)
    values = torch.randn(40, 5, generator=g)
    keys = torch.randn(40, 12, generator=g)
    path = tmp_path_factory.mktemp("hetero") / "hetero.safetensors"
    write_memory(path, keys, values=values)
    return path


@pytest.fixture
def retrieve(invoke, device):
    def run(*args):
        return invoke("retrieve", "--device", str(device), *args)

    return run


def _json(result) -> dict:
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def _same_results(a: dict, b: dict, rel: float = 1e-6) -> None:
    """Metrics equal up to 1e-6 (and `rel`), the same nearest indices and supports."""
    for name, stats in a["metrics"].items():
        if stats is None:
            assert b["metrics"][name] is None, name
            continue
        for stat, value in stats.items():
            # A std is a difference of values of the size of the mean: their last-bit rounding
            # (rel · |mean|) moves it by as much, however small the std itself is.
            scale = abs(stats.get("mean", 0.0)) if stat == "std" else 0.0
            tolerance = max(1e-6, rel * scale)
            assert b["metrics"][name][stat] == pytest.approx(value, rel=rel, abs=tolerance), (
                name,
                stat,
            )
    if "per_query" in a:
        for key in ("nearest", "query_row", "target_index", "support", "steps"):
            assert a["per_query"].get(key) == b["per_query"].get(key), key


# Blockwise and one-shot sums round differently: in float32 an SSE of nearly equal vectors can
# move by a few 1e-6 relative, so the 1e-6 comparison runs in float64 and float32 gets 1e-4.
DTYPES = [("float64", 1e-6), ("float32", 1e-4)]


@pytest.mark.parametrize(("dtype", "rel"), DTYPES)
@pytest.mark.parametrize("model", real_valued_models())
def test_stream_equals_in_memory(retrieve, mnist, model, dtype, rel):
    args = ["--memory", mnist, "--model", model, "--queries", "20", "--mask", "0.5"]
    args += ["--noise", "0.1", "--dtype", dtype, "--per-query", "--json"]
    loaded = _json(retrieve(*args))
    streamed = _json(retrieve(*args, "--stream"))
    _same_results(loaded, streamed, rel)
    assert loaded["config"]["memory"]["stream"] is False
    assert streamed["config"]["memory"]["stream"] is True
    for config in (loaded["config"], streamed["config"]):
        del config["memory"]["stream"]
    assert loaded["config"] == streamed["config"]


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "rel"), DTYPES)
@pytest.mark.parametrize("model", real_valued_models())
def test_small_memory_budget_gives_the_same_metrics(retrieve, mnist, model, dtype, rel):
    args = ["--memory", mnist, "--model", model, "--queries", "12", "--mask", "0.3"]
    args += ["--dtype", dtype, "--per-query", "--json"]
    default = _json(retrieve(*args))
    small = _json(retrieve(*args, "--memory-budget", "64K"))
    _same_results(default, small, rel)
    assert default["config"]["memory_budget"] == 512 * 2**20
    assert small["config"]["memory_budget"] == 64 * 1024
    both = _json(retrieve(*args, "--memory-budget", "64K", "--stream"))
    _same_results(default, both, rel)


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "12X", "0.5", "1.5MB2"])
def test_bad_memory_budget_is_one_error_line(retrieve, mnist, bad):
    assert_one_error_line(retrieve("--memory", mnist, "--memory-budget", bad), "--memory-budget")


def test_parse_size_units():
    assert parse_size("1048576") == 1048576
    assert parse_size("64K") == parse_size("64KiB") == parse_size("64kb") == 65536
    assert parse_size("256M") == 256 * 2**20
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("1.5K") == 1536


def test_stream_hetero_own_queries_and_out(retrieve, hetero, tmp_path):
    g = torch.Generator().manual_seed(2)
    queries = tmp_path / "queries.npy"
    np.save(queries, torch.randn(7, 12, generator=g).numpy())
    args = ["--memory", hetero, "--queries-file", queries, "--target-indices", "0,3,5,7,9,11,39"]
    args += ["--beta", "2", "--per-query", "--json"]
    outs = [tmp_path / "loaded.safetensors", tmp_path / "streamed.safetensors"]
    loaded = _json(retrieve(*args, "--out", outs[0]))
    streamed = _json(retrieve(*args, "--stream", "--out", outs[1]))
    _same_results(loaded, streamed)
    assert streamed["config"]["memory"]["hetero"] is True
    assert streamed["config"]["memory"]["d_v"] == 5
    from safetensors.torch import load_file

    a, b = load_file(str(outs[0])), load_file(str(outs[1]))
    assert set(a) == set(b)
    for key in a:
        assert torch.allclose(a[key].double(), b[key].double(), atol=1e-6), key


@pytest.mark.parametrize("own", [False, True])
def test_stream_save_grid_matches_in_memory(retrieve, mnist, tmp_path, own):
    # The one-shot and the blockwise sums may round differently in the last bit (with two
    # threads, or on another CPU's kernels even with one): a value on a rounding boundary moves
    # a pixel by one grey level (4 of 74,888 seen). Anything more is a different picture.
    args = ["--memory", mnist, "--queries", "5", "--mask", "0.5", "--threads", "1"]
    if own:  # no targets: the grid's third row is the nearest stored pattern, read by index
        from nphcli.memory.file import load_memory

        queries = tmp_path / "queries.npy"
        np.save(queries, load_memory(mnist).patterns[10:20].numpy())
        args += ["--queries-file", queries]
    grids = [tmp_path / "loaded.png", tmp_path / "streamed.png"]
    assert retrieve(*args, "--save-grid", grids[0]).exit_code == 0
    result = retrieve(*args, "--stream", "--save-grid", grids[1])
    assert result.exit_code == 0, result.stderr
    loaded, streamed = (np.asarray(Image.open(g), dtype=np.int16) for g in grids)
    assert loaded.shape == streamed.shape
    moved = np.abs(loaded - streamed)
    assert moved.max() <= 1 and (moved > 0).sum() <= 16, ((moved > 0).sum(), moved.max())


def test_nearest_takes_a_tensor_or_a_bank(mnist):
    g = torch.Generator().manual_seed(3)
    stored = torch.randn(50, 9, generator=g)
    stored[20] = stored[4]  # a tie: the lower index wins
    points = torch.cat([stored[[4, 7, 49]], torch.randn(6, 9, generator=g)])
    index, distance = metrics.nearest(points, stored)
    for bank, rows in ((TensorBank(stored), None), (TensorBank(stored), 7)):
        other_index, other_distance = metrics.nearest(points, bank, block_rows=rows)
        assert torch.equal(index, other_index)
        assert torch.equal(distance, other_distance)
    assert index[:3].tolist() == [4, 7, 49]

    bank = StreamedBank(mnist)
    patterns = torch.cat([keys for _, keys in bank.key_blocks(16)])
    queries = patterns[[3, 30]] + 0.01
    expected = metrics.nearest(queries, patterns)
    streamed = metrics.nearest(queries, bank, block_rows=16)
    assert torch.equal(expected[0], streamed[0]) and torch.equal(expected[1], streamed[1])


def test_streaming_a_foreign_file_notes_the_assumption_once(invoke, tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.rand(12, 8)}, str(tmp_path / "foreign.safetensors"))
    result = invoke("retrieve", "--memory", tmp_path / "foreign.safetensors", "--stream", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.stderr.count("no nph metadata") == 1


class _CountingBank(StreamedBank):
    """A streamed bank that records the largest block of rows anyone asked it for."""

    largest = 0

    def blocks(self, rows):
        _CountingBank.largest = max(_CountingBank.largest, min(rows, self.num_memories))
        return super().blocks(rows)

    def key_blocks(self, rows):
        _CountingBank.largest = max(_CountingBank.largest, min(rows, self.num_memories))
        return super().key_blocks(rows)


@pytest.mark.parametrize("hetero", [False, True])
@pytest.mark.parametrize("model", ["dense", "topk"])
def test_every_block_read_from_disk_fits_the_memory_budget(tmp_path, model, hetero):
    """Retrieval and the metrics after it (the nearest-pattern search) read a streamed memory in
    blocks that fit --memory-budget, keys and values together: the metrics once read 2²⁴
    entries per block whatever the budget (a larger-than-memory run failed on it), and
    counted only the values' width of a hetero-associative file."""
    from nphcli.evaluation.evaluate import evaluate
    from nphcli.evaluation.settings import settings_from

    path = tmp_path / "m.safetensors"
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(20_000, 128, generator=generator)
    values = torch.randn(20_000, 4, generator=generator) if hetero else None
    write_memory(path, keys, values=values)
    budget = 1 << 20
    params = {"k": 4} if model == "topk" else {}
    settings = settings_from(model, params, {"memory_budget": budget, "queries": 20})
    _CountingBank.largest = 0
    report = evaluate(_CountingBank(path), settings)
    assert report.metrics["sse"]["mean"] is not None
    row_bytes = (128 + (4 if hetero else 0)) * 4
    assert 0 < _CountingBank.largest * row_bytes <= budget, _CountingBank.largest


def test_the_nearest_search_over_a_resident_memory_fits_the_budget(monkeypatch):
    """A memory in RAM is searched in blocks too: each block's copy and square of the values
    fit the budget (they once took min(M, 2²⁴) rows at a time)."""
    from nphcli.evaluation import evaluate as evaluation
    from nphcli.evaluation.settings import settings_from

    asked = []
    real = metrics.nearest

    def spy(points, stored, **blocks):
        asked.append(blocks)
        return real(points, stored, **blocks)

    monkeypatch.setattr(metrics, "nearest", spy)
    keys = torch.randn(20_000, 128, generator=torch.Generator().manual_seed(0))
    budget = 1 << 20
    settings = settings_from("dense", {}, {"memory_budget": budget, "queries": 20})
    evaluation.evaluate(TensorBank(keys), settings)
    assert asked
    for blocks in asked:
        assert 0 < blocks["block_rows"] * 128 * 4 * 2 <= budget, blocks
        assert 0 < blocks["block_elements"] * 4 * 2 <= budget, blocks


@pytest.mark.parametrize("rows", [None, 1, 2, 3, 7])
def test_the_nearest_row_does_not_depend_on_where_blocks_are_cut(rows):
    """Scores 0.6·tol and 1.2·tol below a first row's: each is a tie of its neighbour, not of
    the last, and the answer is the lowest index within tol of the minimum (row 2) however the
    blocks are cut (comparing blocks in turn gave row 1 or row 2 by block size)."""
    point = torch.zeros(1, 1, dtype=torch.float64)  # scores: ‖s‖², the largest 81
    tol = 16 * torch.finfo(torch.float64).eps * 81.0  # `nearest`'s rounding allowance, d = 1
    near = [math.sqrt(1.0 - f * tol) for f in (0.0, 0.6, 1.2)]
    stored = [9.0, near[0], near[1], 8.0, 8.5, near[2], 7.0]
    bank = TensorBank(torch.tensor(stored, dtype=torch.float64)[:, None])
    index, _ = metrics.nearest(point, bank, block_rows=rows)
    assert index.tolist() == [2]


def test_the_attractor_diagnostics_read_blocks_within_the_budget(tmp_path):
    """An iterated run's attractor diagnostics read the streamed keys in the budget's blocks
    too (they read 2¹⁶ rows at a time, whatever the budget)."""
    from nphcli.evaluation.evaluate import evaluate
    from nphcli.evaluation.settings import settings_from

    path = tmp_path / "m.safetensors"
    write_memory(path, torch.randn(20_000, 128, generator=torch.Generator().manual_seed(0)))
    budget = 1 << 20
    settings = settings_from("dense", {"steps": 3}, {"memory_budget": budget, "queries": 8})
    _CountingBank.largest = 0
    report = evaluate(_CountingBank(path), settings)
    assert report.metrics["at_pattern"]["mean"] is not None  # the diagnostics ran
    assert 0 < _CountingBank.largest * 128 * 4 <= budget, _CountingBank.largest
