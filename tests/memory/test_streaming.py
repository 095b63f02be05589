"""Memories streamed from a memory file give the same results as memories loaded into RAM."""

from __future__ import annotations

import pytest
import torch
from conftest import real_valued_models, write_memory
from safetensors.torch import save_file

from nphcli.core.errors import NphError
from nphcli.engine.planning import Plan
from nphcli.memory.file import load_memory
from nphcli.memory.streamed import StreamedBank
from nphcli.models import create_model

PARAMS = {
    "multihead": {"heads": 2},
    "random-feature": {"features": 24},
    "topk": {"k": 3},
    "random": {"k": 2, "seed": 1},
    "window": {"window": 1},
    "entmax": {"alpha": 1.5},
}


def _memory(tmp_path, *, values: bool, dtype=torch.float64):
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(40, 6, generator=generator, dtype=torch.float64)
    stored_values = torch.randn(40, 4, generator=generator, dtype=torch.float64) if values else None
    labels = torch.arange(40) % 3
    path = tmp_path / "memory.safetensors"
    write_memory(path, keys, values=stored_values, labels=labels, dtype=dtype)
    queries = torch.randn(9, 6, generator=generator, dtype=torch.float64)
    return path, queries


@pytest.mark.parametrize("values", [False, True], ids=["auto", "hetero"])
@pytest.mark.parametrize("name", real_valued_models())
def test_streamed_equals_in_memory(device, tmp_path, name, values):
    path, queries = _memory(tmp_path, values=values)
    memory = load_memory(path)
    queries = queries.to(device)
    model = create_model(name, **PARAMS.get(name, {}))
    expected = model.retrieve(queries, memory.patterns.to(device), _to(memory.values, device))
    bank = StreamedBank(path, device=device)
    for plan in (None, Plan(query_rows=4, memory_rows=7), Plan(query_rows=9, memory_rows=1)):
        got = model.retrieve(queries, bank, plan=plan)
        torch.testing.assert_close(got.patterns, expected.patterns, rtol=0, atol=1e-12)
        if expected.support is not None:
            assert torch.equal(got.support, expected.support)


def _to(tensor, device):
    return None if tensor is None else tensor.to(device)


def test_bank_reads_blocks_rows_and_labels(tmp_path):
    path, _ = _memory(tmp_path, values=True, dtype=torch.float32)
    memory = load_memory(path)
    bank = StreamedBank(path)
    assert (bank.num_memories, bank.dim, bank.value_dim) == (40, 6, 4)
    assert bank.dtype == torch.float32
    starts = []
    for start, keys, values in bank.blocks(15):
        starts.append(start)
        assert torch.equal(keys, memory.patterns[start : start + 15])
        assert torch.equal(values, memory.values[start : start + 15])
    assert starts == [0, 15, 30]
    index = torch.tensor([[3, 39], [3, 0]])
    keys, values = bank.gather(index)
    assert torch.equal(keys, memory.patterns[index]) and torch.equal(values, memory.values[index])
    assert torch.equal(bank.labels, memory.labels)
    wider = bank.to(dtype=torch.float64)
    assert wider.dtype == torch.float64 and bank.dtype == torch.float32
    assert next(wider.blocks(5))[1].dtype == torch.float64


def test_half_file_is_computed_in_float32(tmp_path):
    path, queries = _memory(tmp_path, values=False, dtype=torch.float16)
    memory = load_memory(path)
    model = create_model("dense")
    expected = model.retrieve(queries.half(), memory.patterns).patterns
    got = model.retrieve(queries.half(), StreamedBank(path)).patterns
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-3)


def test_foreign_single_matrix_file(tmp_path):
    keys = torch.randn(12, 5, dtype=torch.float64)
    path = tmp_path / "foreign.safetensors"
    save_file({"embeddings": keys}, str(path))
    bank = StreamedBank(path)
    assert bank.key_name == "embeddings" and bank.labels is None
    queries = torch.randn(3, 5, dtype=torch.float64)
    expected = create_model("dense").retrieve(queries, keys).patterns
    got = create_model("dense").retrieve(queries, bank).patterns
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_non_finite_rows_are_reported_when_read(tmp_path):
    keys = torch.randn(20, 3, dtype=torch.float64)
    keys[13, 1] = float("nan")
    path = tmp_path / "bad.safetensors"
    save_file({"patterns": keys}, str(path))
    bank = StreamedBank(path)  # only the header is read here
    with pytest.raises(NphError, match="NaN or infinite values in rows from 10"):
        queries = torch.randn(2, 3, dtype=torch.float64)
        create_model("dense").retrieve(queries, bank, plan=Plan(2, 5))


@pytest.mark.parametrize(
    ("contents", "message"),
    [
        ({"patterns": torch.zeros(4, dtype=torch.float64)}, "2-D"),
        ({"patterns": torch.zeros(4, 2, dtype=torch.int64)}, "floating point"),
    ],
)
def test_unusable_files_raise(tmp_path, contents, message):
    path = tmp_path / "odd.safetensors"
    save_file(contents, str(path))
    with pytest.raises(NphError, match=message):
        StreamedBank(path)


def test_missing_file_raises(tmp_path):
    with pytest.raises(NphError, match="not found"):
        StreamedBank(tmp_path / "absent.safetensors")
