"""Memory files: round trips, metadata, foreign files, atomic writes, unreadable input."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import nphcli.memory.file as memory_file
from nphcli.core.dtypes import COMPUTE_DTYPES, torch_dtype
from nphcli.core.errors import NphError, NphRuntimeError
from nphcli.memory.file import load_memory, save_memory
from nphcli.memory.format import FORMAT_NAME, read_metadata

RESERVED = {"format", "format_version", "nph_version", "created", "M", "d", "dtype"}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)
meta_dicts = st.dictionaries(
    st.text(min_size=1, max_size=8).filter(lambda k: k not in RESERVED), json_values, max_size=4
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(sorted(COMPUTE_DTYPES)),
    M=st.integers(1, 5),
    d=st.integers(1, 6),
    d_v=st.none() | st.integers(1, 4),
    with_labels=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    meta=meta_dicts,
)
def test_round_trip(dtype, M, d, d_v, with_labels, seed, meta):
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(M, d, generator=generator, dtype=torch.float64) * 10
    labels = torch.randint(0, 10, (M,), generator=generator) if with_labels else None
    values = None if d_v is None else torch.randn(M, d_v, generator=generator)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.safetensors"
        save_memory(
            path, patterns, labels=labels, values=values, meta=meta, dtype=torch_dtype(dtype)
        )
        memory = load_memory(path)
        assert read_metadata(path) == memory.meta
    assert memory.patterns.dtype == torch_dtype(dtype)
    assert torch.equal(memory.patterns, patterns.to(torch_dtype(dtype)))
    if with_labels:
        assert memory.labels.dtype == torch.int64 and torch.equal(memory.labels, labels)
    else:
        assert memory.labels is None
    if d_v is None:
        assert not memory.hetero and memory.values is memory.patterns
    else:
        assert memory.hetero
        assert torch.equal(memory.values, values.to(torch_dtype(dtype)))
    for key, value in meta.items():
        assert memory.meta[key] == value
    assert memory.meta["format"] == FORMAT_NAME
    assert (memory.meta["M"], memory.meta["d"], memory.meta["dtype"]) == (M, d, dtype)
    assert memory.num_memories == M and memory.dim == d


def test_item_shape_from_meta(tmp_path):
    path = save_memory(tmp_path / "m.safetensors", torch.rand(2, 4), meta={"item_shape": [1, 2, 2]})
    assert load_memory(path).item_shape == (1, 2, 2)


def test_foreign_single_matrix_loads_with_notice(tmp_path, caplog):
    path = tmp_path / "foreign.safetensors"
    embeddings = torch.randn(4, 3)
    save_file({"embeddings": embeddings, "bias": torch.zeros(3)}, str(path))
    with caplog.at_level(logging.WARNING, logger="nph"):
        memory = load_memory(path)
    assert torch.equal(memory.patterns, embeddings)
    assert memory.labels is None and memory.item_shape is None
    assert "no nph metadata" in caplog.text and "'embeddings'" in caplog.text


def test_foreign_file_with_two_matrices_is_an_error(tmp_path):
    path = tmp_path / "two.safetensors"
    save_file({"a": torch.zeros(2, 2), "b": torch.zeros(3, 2)}, str(path))
    with pytest.raises(NphError, match="2-D tensors"):
        load_memory(path)


def test_existing_file_needs_force(tmp_path):
    path = save_memory(tmp_path / "m.safetensors", torch.ones(2, 2))
    before = path.read_bytes()
    with pytest.raises(NphError, match="--force"):
        save_memory(path, torch.zeros(3, 3))
    assert path.read_bytes() == before
    save_memory(path, torch.zeros(3, 3), force=True)
    assert load_memory(path).patterns.shape == (3, 3)


@pytest.mark.parametrize(
    "failure, expected",
    [(OSError(28, "No space left on device"), NphRuntimeError), (KeyboardInterrupt, None)],
)
def test_failed_write_leaves_previous_file_byte_identical(tmp_path, monkeypatch, failure, expected):
    path = save_memory(tmp_path / "m.safetensors", torch.arange(6.0).reshape(2, 3))
    before = path.read_bytes()

    def partial_open(filename, mode="r", *args, **kwargs):
        if "w" in mode:
            with open(filename, "wb") as handle:
                handle.write(b"\x00" * 100)  # some bytes of the new file, then the failure
            raise failure
        return open(filename, mode, *args, **kwargs)

    monkeypatch.setattr(memory_file, "open", partial_open, raising=False)
    with pytest.raises(expected or KeyboardInterrupt):
        save_memory(path, torch.zeros(50, 50), force=True)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no temporary left


@pytest.mark.parametrize(
    "content, message",
    [(None, "not found"), (b"", "empty"), (b"not a safetensors file at all", "not a readable")],
)
def test_unreadable_files_are_user_errors(tmp_path, content, message):
    path = tmp_path / "bad.safetensors"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(NphError, match=message):
        load_memory(path)


def test_rejects_non_finite_and_wrong_shapes(tmp_path):
    with pytest.raises(NphError, match="NaN"):
        save_memory(tmp_path / "a.safetensors", torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(NphError, match="2-D"):
        save_memory(tmp_path / "b.safetensors", torch.zeros(3))
    with pytest.raises(NphError, match="labels"):
        save_memory(tmp_path / "c.safetensors", torch.zeros(3, 2), labels=torch.zeros(2))
