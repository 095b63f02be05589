"""`store_memory` from Python (what `nph store` runs) and `check_output`, the output-path check
every command makes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from nphcli.app.store import store_memory
from nphcli.core.atomic import check_output
from nphcli.core.errors import NphError
from nphcli.memory import open_memory


def test_store_memory_pairs_values_and_labels_and_shards(tmp_path, invoke):
    values = np.arange(60, dtype=np.float32).reshape(30, 2)
    labels = np.arange(30) % 4
    np.save(tmp_path / "values.npy", values)
    np.save(tmp_path / "labels.npy", labels)
    out = tmp_path / "m.safetensors"
    stored = store_memory(
        "random",
        out,
        values=tmp_path / "values.npy",
        labels=tmp_path / "labels.npy",
        parts=2,
        n=30,
        dim=5,
        seed=7,
    )
    memory = open_memory(out)
    assert stored.path == out and stored.labelled and stored.manifest.is_file()
    assert stored.meta["values_file"] == "values.npy" and stored.meta["d_v"] == 2
    assert memory.patterns.shape == (30, 5) and torch.equal(memory.values, torch.tensor(values))
    assert torch.equal(memory.labels, torch.tensor(labels))
    joined = open_memory(stored.manifest)
    assert torch.equal(joined.patterns, memory.patterns)
    # the same memory as `nph store` writes with the same options
    cli = tmp_path / "cli.safetensors"
    args = ["--values", tmp_path / "values.npy", "--labels", tmp_path / "labels.npy"]
    result = invoke("store", "random", "--n", "30", "--dim", "5", "--seed", "7", *args,
                    "--out", cli, "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert torch.equal(open_memory(cli).patterns, memory.patterns)
    assert json.loads(result.stdout)["labels"] is True


def test_store_memory_refuses_before_reading(tmp_path):
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"old")
    with pytest.raises(NphError, match="--force"):
        store_memory("random", out, n=3, dim=2)  # the output is refused, the source unread
    with pytest.raises(NphError, match="unknown source"):
        store_memory("no-such-source", out)  # a wrong name is said first: --force won't help
    with pytest.raises(NphError, match="unknown source option"):
        store_memory("random", tmp_path / "new.safetensors", colour="red")
    with pytest.raises(NphError, match="name it .safetensors"):
        store_memory("random", tmp_path / "m.npy", n=3, dim=2)
    assert out.read_bytes() == b"old"


def test_check_output_refuses_inputs_missing_folders_and_existing_files(tmp_path):
    source = tmp_path / "in.npy"
    source.write_bytes(b"x")
    with pytest.raises(NphError, match="is an input"):
        check_output(source, force=True, protect=[source])
    with pytest.raises(NphError, match="does not exist"):
        check_output(tmp_path / "absent" / "out.png", force=False)
    with pytest.raises(NphError, match="--force"):
        check_output(source, force=False)
    assert check_output(source, force=True, protect=[tmp_path / "other"]) == source


def _full_disk(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_a_failed_text_store_leaves_no_sidecar_and_keeps_the_old_pair(tmp_path, monkeypatch):
    """The sidecar is placed only when the memory is written: a full disk during a fresh store
    leaves nothing; during a --force store, the old memory with its own sidecar."""
    texts = tmp_path / "texts.txt"
    texts.write_text("one fish\ntwo fish\n")
    out = tmp_path / "out" / "m.safetensors"
    out.parent.mkdir()
    with monkeypatch.context() as patch:
        patch.setattr("nphcli.memory.file.open", _full_disk, raising=False)
        with pytest.raises(NphError, match="no space left"):
            store_memory(texts, out, embed="hash-8")
    assert os.listdir(out.parent) == []
    store_memory(texts, out, embed="hash-8")
    before = {path.name: path.read_bytes() for path in out.parent.iterdir()}
    texts.write_text("red fish\nblue fish\nold fish\n")
    with monkeypatch.context() as patch:
        patch.setattr("nphcli.memory.file.open", _full_disk, raising=False)
        with pytest.raises(NphError, match="no space left"):
            store_memory(texts, out, embed="hash-8", force=True)
    assert {path.name: path.read_bytes() for path in out.parent.iterdir()} == before
    assert open_memory(out).num_memories == 2
    # A store that replaces it removes the sidecar nothing names any more.
    stored = store_memory(texts, out, embed="hash-8", force=True)
    assert sorted(os.listdir(out.parent)) == sorted(["m.safetensors", stored.meta["items"]["file"]])


def test_a_replaced_sidecar_that_shards_still_name_is_kept(tmp_path):
    texts = tmp_path / "texts.txt"
    texts.write_text("one fish\ntwo fish\nred fish\nblue fish\n")
    out = tmp_path / "m.safetensors"
    first = store_memory(texts, out, embed="hash-8", parts=2).meta["items"]["file"]
    texts.write_text("a\nb\n")
    second = store_memory(texts, out, embed="hash-8", force=True).meta["items"]["file"]
    assert first != second and (tmp_path / first).exists() and (tmp_path / second).exists()
    assert open_memory(tmp_path / "m.shards.json").num_memories == 4
