"""`store_memory` from Python (what `nph store` runs) and `check_output`, the output-path check
every command makes."""

from __future__ import annotations

import json

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
