"""Hostile inputs to the Python API: one row per case, each an `NphError`
with one line saying what to do, never a raw TypeError, RuntimeError or AttributeError from
torch. docs/errors.md ("Hostile and unlucky inputs") and docs/python-api.md say what a user
sees; the inputs that are accepted (numpy arrays, lists, a path) are checked below the table."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nphcli as nph
from nphcli.layers import NPH, NPHLayer, NPHPooling

X = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))  # (M, d)
Q = X[:2].clone()  # (Q, d)
NAN_ROW = torch.cat([X, torch.full((1, 4), math.nan)])  # row 6 is NaN
SETTINGS = {"model": "dense"}


def _evaluate(memory, **settings):
    return nph.evaluate(memory, nph.RetrieveSettings(**{**SETTINGS, **settings}))


# (case, the call, words its one error line holds)
CASES = [
    ("d = 0", lambda: nph.retrieve(torch.randn(2, 0), torch.randn(5, 0)), ["d = 0"]),
    ("M = 0", lambda: nph.retrieve(Q, torch.randn(0, 4)), ["M = 0"]),
    ("1-D queries", lambda: nph.retrieve(X[0], X), ["2-D", "(4,)"]),
    ("3-D memory", lambda: nph.retrieve(Q, X[None]), ["2-D", "(1, 6, 4)"]),
    ("ragged list", lambda: nph.retrieve([[1.0, 2.0], [3.0]], X), ["rows of one length"]),
    ("list of strings", lambda: nph.retrieve([["a", "b"]], X), ["table of numbers"]),
    ("numpy of objects", lambda: nph.retrieve(np.array([[{}]]), X), ["not numbers"]),
    ("meta queries", lambda: nph.retrieve(Q.to("meta"), X), ["meta-device", "holds no values"]),
    ("meta memory", lambda: nph.retrieve(Q.to("meta"), X.to("meta")), ["meta-device"]),
    ("integer memory", lambda: nph.retrieve(Q, X.long()), ["floating point", ".float()"]),
    ("numpy integers", lambda: nph.retrieve(Q.numpy(), np.ones((3, 4), int)), ["int64"]),
    ("bool queries", lambda: nph.retrieve(Q > 0, X), ["floating point", "bool"]),
    ("complex queries", lambda: nph.retrieve(Q.to(torch.complex64), X), ["complex64"]),
    ("mismatched d", lambda: nph.retrieve(torch.randn(2, 3), X), ["dimension 3", "have 4"]),
    ("values of another M", lambda: nph.retrieve(Q, X, torch.randn(5, 4)), ["5 values for 6"]),
    ("NaN in memory", lambda: nph.retrieve(Q, NAN_ROW), ["row 6 holds NaN"]),
    ("memory is None", lambda: nph.retrieve(Q, None), ["numpy array", "NoneType"]),
    ("memory path missing", lambda: nph.retrieve(Q, "absent.safetensors"), ["not found"]),
    ("beta = 0", lambda: nph.retrieve(Q, X, beta=0), ["--beta", "> 0"]),
    ("beta negative", lambda: nph.retrieve(Q, X, beta=-1.0), ["--beta"]),
    ("beta NaN", lambda: nph.retrieve(Q, X, beta=math.nan), ["--beta"]),
    ("beta a string", lambda: nph.retrieve(Q, X, beta="1"), ["--beta", "'1'"]),
    ("tol a string", lambda: nph.retrieve(Q, X, tol="x"), ["--tol", "'x'"]),
    ("k > M", lambda: nph.retrieve(Q, X, model="topk", k=10), ["exceeds the 6"]),
    ("k = 0", lambda: nph.retrieve(Q, X, model="topk", k=0), ["--k"]),
    ("k = 2.5", lambda: nph.create_model("topk", k=2.5), ["must be whole"]),
    ("steps a string", lambda: nph.create_model("dense", steps="3"), ["--steps", "'3'"]),
    ("unknown parameter", lambda: nph.retrieve(Q, X, bta=1.0), ["does not take --bta"]),
    ("memory_budget = 0", lambda: nph.retrieve(Q, X, memory_budget=0), ["--memory-budget"]),
    ("memory_budget < 0", lambda: nph.retrieve(Q, X, memory_budget=-5), ["--memory-budget"]),
    ("Memory of 1-D", lambda: nph.Memory(torch.randn(4)), ["2-D"]),
    ("Memory values count", lambda: nph.Memory(X, torch.randn(5, 2)), ["5 values for 6"]),
    ("Memory labels count", lambda: nph.Memory(X, labels=torch.arange(5)), ["labels", "(6,)"]),
    ("open_memory(None)", lambda: nph.open_memory(None), ["path", "NoneType"]),
    ("evaluate: settings a dict", lambda: nph.evaluate(X, SETTINGS), ["RetrieveSettings"]),
    ("evaluate: d = 0", lambda: _evaluate(nph.Memory(torch.randn(3, 0))), ["d ≥ 1"]),
    ("evaluate: M = 0", lambda: _evaluate(nph.Memory(torch.randn(0, 3))), ["M ≥ 1"]),
    ("evaluate: NaN row", lambda: _evaluate(nph.Memory(NAN_ROW)), ["row 6 holds NaN"]),
    ("evaluate: meta", lambda: _evaluate(X.to("meta")), ["meta-device"]),
    ("RetrieveSettings: model", lambda: nph.RetrieveSettings(model="dnse"), ["unknown model"]),
    (
        "RetrieveSettings: corruption dict",
        lambda: nph.RetrieveSettings(model="dense", corruption={"noise": 0.1}),
        ["nph.Corruption("],
    ),  # fmt: skip
    ("store: n = 2.5", lambda: nph.store("random", "never.safetensors", n=2.5), ["--n", "2.5"]),
    ("NPH: head_dim < 0", lambda: NPH(4, head_dim=-1), ["head_dim"]),
    ("NPH: out_dim 2.5", lambda: NPH(4, out_dim=2.5), ["out_dim"]),
    ("NPHLayer: memories 0", lambda: NPHLayer(4, memories=0), ["memories"]),
    ("NPHPooling: d_model 0", lambda: NPHPooling(0), ["d_model"]),
    ("NPH: a list input", lambda: NPH(4)([[1.0] * 4]), ["must be a tensor"]),
    (
        "NPH: integer input",
        lambda: NPH(4)(torch.ones(1, 2, 4, dtype=torch.long)),
        ["floating point"],
    ),  # fmt: skip
]


@pytest.mark.parametrize("case, call, words", CASES, ids=[c[0] for c in CASES])
def test_hostile_api_input_is_one_nph_error(case, call, words):
    with pytest.raises(nph.NphError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and message.strip() == message
    for word in words:
        assert word in message, (case, message)


def test_numpy_arrays_and_lists_are_taken_by_one_rule(tmp_path):
    """numpy arrays keep their dtype (zero copy); lists become float32; a path is opened; the
    numbers are those of the same tensors."""
    want = nph.retrieve(Q, X, model="topk", k=3).patterns
    assert torch.equal(nph.retrieve(Q.numpy(), X.numpy(), model="topk", k=3).patterns, want)
    assert torch.equal(nph.retrieve(Q.tolist(), X.tolist(), model="topk", k=3).patterns, want)
    as_tuple = nph.retrieve(tuple(map(tuple, Q.tolist())), X, model="topk", k=3).patterns
    assert torch.equal(as_tuple, want)
    wide = nph.retrieve(Q.double().numpy(), X.double().numpy()).patterns
    assert wide.dtype == torch.float64
    assert torch.equal(wide, nph.retrieve(Q.double(), X.double()).patterns)
    ones = nph.retrieve([[1, 0]], [[1, 0], [0, 1]], beta=5.0).patterns  # ints in a list: floats
    assert ones.dtype == torch.float32
    from nphcli.memory.file import save_memory

    path = save_memory(tmp_path / "m.safetensors", X)
    assert torch.equal(nph.retrieve(Q, str(path)).patterns, nph.retrieve(Q, X).patterns)
    assert torch.equal(nph.Memory(X.numpy()).patterns, X)


def test_empty_queries_still_give_an_empty_answer():
    out = nph.retrieve(torch.empty(0, 4), X, model="topk", k=2)
    assert out.patterns.shape == (0, 4) and out.steps.shape == (0,)


def test_evaluate_takes_a_tensor_or_a_path(tmp_path):
    from nphcli.memory.file import save_memory

    settings = nph.RetrieveSettings(model="dense", params={"beta": 2.0}, queries=3)
    from_bank = nph.evaluate(nph.Memory(X), settings)
    for memory in (X, save_memory(tmp_path / "m.safetensors", X)):
        assert torch.equal(nph.evaluate(memory, settings).retrieved, from_bank.retrieved)


def test_a_memory_changed_in_place_gets_a_fresh_hash(tmp_path):
    """The content hash follows the tensors: a loaded memory edited in place, given new
    patterns, or moved after an edit names its new rows, not the file it came from."""
    from nphcli.memory.file import load_memory
    from nphcli.memory.provenance import content_sha256, tensors_digest

    path = nph.store("random", tmp_path / "m.safetensors", n=6, dim=4).path
    memory = load_memory(path)
    first = content_sha256(memory)
    assert first == memory.meta["content_sha256"]  # as loaded: the file's, verified
    assert content_sha256(memory.to(dtype=torch.float64)) == first  # the same memory, converted
    memory.patterns.mul_(2)  # in place: the file's record no longer names these rows
    edited = content_sha256(memory)
    assert edited != first and edited == tensors_digest({"patterns": memory.patterns})
    assert content_sha256(memory.to("cpu")) == edited
    memory.keys = memory.keys.clone()  # replaced, same rows
    assert content_sha256(memory) == edited
    memory.keys[0, 0] = 5.0
    assert content_sha256(memory) == tensors_digest({"patterns": memory.keys})
    built = nph.Memory(X.clone())  # built in Python: hashed from RAM, and again once edited
    before = content_sha256(built)
    built.patterns[1] += 1
    assert content_sha256(built) != before
