"""`open_memory`: one entry point for every memory; the same file gives the same labels, values,
item shape and metadata loaded or streamed, foreign files included."""

from __future__ import annotations

import logging

import pytest
import torch
from safetensors.torch import save_file

from nphcli.core.errors import NphError
from nphcli.memory import open_memory
from nphcli.memory.bank import Memory
from nphcli.memory.file import load_memory, save_memory
from nphcli.memory.sharded_bank import ShardedBank
from nphcli.memory.shards import write_shards
from nphcli.memory.streamed import StreamedBank


def _nph_file(folder, *, values: bool, labels: bool):
    generator = torch.Generator().manual_seed(3)
    path = folder / "nph.safetensors"
    save_memory(
        path,
        torch.randn(12, 4, generator=generator),
        values=torch.randn(12, 2, generator=generator) if values else None,
        labels=torch.arange(12) % 5 if labels else None,
        meta={"item_shape": [1, 2, 2], "note": "kept"},
    )
    return path


def _foreign_file(folder, tensors: dict, metadata: dict | None = None):
    path = folder / "foreign.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    return path


def _foreign_cases():
    rows = torch.randn(12, 4, generator=torch.Generator().manual_seed(4))
    labels = torch.arange(12, dtype=torch.int32) % 3
    return {
        "patterns+labels": {"patterns": rows, "labels": labels},
        "patterns+labels+values": {"patterns": rows, "labels": labels, "values": rows[:, :2] * 2},
        "one matrix, labels beside": {"emb": rows, "labels": labels},
        "one matrix": {"emb": rows},
    }


def _contents(bank):
    """What a caller sees of a memory, whatever kind of bank holds it."""
    keys, values = bank.gather(torch.arange(bank.num_memories))
    return {
        "keys": keys,
        "values": values,
        "hetero": bank.hetero,
        "labels": bank.labels,
        "item_shape": bank.item_shape,
        "meta": {k: v for k, v in bank.meta.items() if k != "created"},
        "path": bank.path,
        "dtype": bank.dtype,
    }


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


@pytest.mark.parametrize("values", [False, True], ids=["auto", "hetero"])
@pytest.mark.parametrize("labels", [False, True], ids=["unlabelled", "labelled"])
def test_nph_file_same_loaded_or_streamed(tmp_path, values, labels):
    path = _nph_file(tmp_path, values=values, labels=labels)
    loaded, streamed = open_memory(path), open_memory(path, stream=True)
    assert isinstance(loaded, Memory) and isinstance(streamed, StreamedBank)
    _assert_same(_contents(streamed), _contents(loaded))
    assert loaded.item_shape == (1, 2, 2) and loaded.meta["note"] == "kept"
    assert (loaded.labels is not None) == labels


@pytest.mark.parametrize("case", list(_foreign_cases()))
def test_foreign_file_same_loaded_or_streamed(tmp_path, caplog, case):
    """Regression: a foreign file with `patterns` and `labels` had labels when loaded, none
    when streamed, and both said "no labels"."""
    tensors = _foreign_cases()[case]
    path = _foreign_file(tmp_path, tensors, metadata={"item_shape": "not nph's", "tool": "x"})
    notes = []
    opened = []
    for stream in (False, True):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nph"):
            opened.append(open_memory(path, stream=stream))
        notes.append(caplog.text)
    loaded, streamed = opened
    _assert_same(_contents(streamed), _contents(loaded))
    paired = "patterns" in tensors
    if paired:
        assert torch.equal(loaded.labels, tensors["labels"].long())
        assert loaded.labels.dtype == torch.int64
        assert "'labels' as labels" in notes[0] and "no labels" not in notes[0]
    else:  # names beside a guessed tensor mean nothing
        assert loaded.labels is None and "no labels" in notes[0]
    assert loaded.hetero == ("values" in tensors)
    assert loaded.item_shape is None  # the foreign "item_shape" is kept aside, not used
    assert loaded.meta["foreign_metadata"] == {"item_shape": "not nph's", "tool": "x"}
    assert notes[0] == notes[1] and notes[0].count("no nph metadata") == 1


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"patterns": torch.ones(4, 2), "labels": torch.ones(3, dtype=torch.int64)}, "shape"),
        ({"patterns": torch.ones(4, 2), "labels": torch.ones(4)}, "integers"),
        ({"patterns": torch.ones(4, 2), "values": torch.ones(3, 2)}, "3 values for 4"),
    ],
)
def test_foreign_labels_and_values_are_checked_alike(tmp_path, tensors, message):
    path = _foreign_file(tmp_path, tensors)
    for stream in (False, True):
        with pytest.raises(NphError, match=message):
            open_memory(path, stream=stream)


@pytest.mark.parametrize("values", [False, True], ids=["auto", "hetero"])
def test_manifest_same_loaded_or_streamed_as_its_file(tmp_path, values):
    path = _nph_file(tmp_path, values=values, labels=True)
    manifest = write_shards(path, tmp_path, sizes=[5, 7])
    original = _contents(open_memory(path))
    for stream in (False, True):
        bank = open_memory(manifest, stream=stream)
        assert isinstance(bank, ShardedBank if stream else Memory)
        got = _contents(bank)
        for key in ("keys", "values", "labels"):
            assert torch.equal(got[key], original[key]), key
        assert got["item_shape"] == original["item_shape"] and got["hetero"] == values
        assert got["meta"]["note"] == "kept" and got["meta"]["M"] == 12
        assert got["meta"]["shard_set"]["parts"] == 2 and "shard" not in got["meta"]


def test_device_and_dtype_are_applied(tmp_path, device):
    path = _nph_file(tmp_path, values=True, labels=False)
    manifest = write_shards(path, tmp_path, sizes=[6, 6])
    for target in (path, manifest):
        for stream in (False, True):
            bank = open_memory(target, stream=stream, device=device, dtype=torch.float64)
            keys, values = bank.gather(torch.tensor([0, 11], device=device))
            assert keys.dtype == values.dtype == torch.float64
            assert keys.device.type == values.device.type == device.type


def test_one_file_is_not_a_rank_share(tmp_path):
    path = _nph_file(tmp_path, values=False, labels=False)
    with pytest.raises(NphError, match="shard manifest"):
        open_memory(path, owned=range(1))


def test_load_memory_refuses_a_manifest_with_what_to_use(tmp_path):
    path = _nph_file(tmp_path, values=False, labels=False)
    manifest = write_shards(path, tmp_path, parts=2)
    with pytest.raises(NphError, match="open_memory"):
        load_memory(manifest)
