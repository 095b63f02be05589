"""A source registered from outside the package (architecture.md, "Adding things: a source")
is a `nph store` argument and a `nphcli.store` name with no other edit."""

from __future__ import annotations

import pytest
import torch

from nphcli.memory.file import load_memory
from nphcli.sources import base
from nphcli.sources.base import VECTOR, Loaded, SourceOptions, register_source


@pytest.fixture
def counting(monkeypatch):
    """A source `counting`: row i is (i, i + 1, i + 2); removed from the registry afterwards."""
    monkeypatch.setattr(base, "_NAMED", dict(base._NAMED))

    @register_source("counting", summary="rows (i, i + 1, i + 2)")
    def load_counting(spec: str, options: SourceOptions) -> Loaded:
        n = 4 if options.n is None else options.n
        patterns = torch.arange(n, dtype=torch.float32)[:, None] + torch.arange(3.0)  # (n, 3)
        return Loaded(patterns, None, {"source": spec, "kind": VECTOR, "origin": "counting"})

    return load_counting


def test_a_registered_source_is_stored_by_the_cli_and_the_library(counting, invoke, tmp_path):
    out = tmp_path / "m.safetensors"
    result = invoke("store", "counting", "--normalize", "none", "--out", out)
    assert result.exit_code == 0, result.stderr
    memory = load_memory(out)
    assert memory.patterns.tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
    assert memory.meta["source"] == "counting"

    import nphcli

    nphcli.store("counting", tmp_path / "lib.safetensors", normalize="none")
    assert torch.equal(load_memory(tmp_path / "lib.safetensors").patterns, memory.patterns)
