"""The CPU's one-read kernel for a few queries (`nphcli.engine.cpu_decode`, the `fast` extra)
against the formula in float64, and the route: taken for dense with 1–3 float32 queries on a
large enough memory, never for more queries, other dtypes or gradients, and left silently
where numba is not installed. Its speed is measured by `benchmarks/cpu_pace.py`, never here."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from nphcli.engine import attention
from nphcli.memory.bank import TensorBank
from nphcli.models import create_model

pytest.importorskip("numba", reason="the kernel needs numba (the fast extra)")


def _reference(queries, keys, values, beta):
    scores = beta * queries.double() @ keys.double().T  # (Q, M)
    return torch.softmax(scores, dim=1) @ values.double()  # (Q, d_v)


def _fold(partials):
    best, norm, total = partials  # (P, Q), (P, Q), (P, Q, d_v)
    rescale = torch.exp(best - best.amax(dim=0))
    return (total * rescale[..., None]).sum(0) / (norm * rescale).sum(0)[:, None]


@pytest.mark.parametrize("num_queries", [1, 3])
@pytest.mark.parametrize("programs", [1, 3])
@pytest.mark.parametrize("hetero", [False, True])
def test_partials_fold_to_the_formula(monkeypatch, num_queries, programs, hetero):
    """Rows in an order that raises the max block after block (every block rescales), a
    count that is no multiple of the block, and slices run on threads."""
    from nphcli.engine import cpu_decode

    monkeypatch.setattr(cpu_decode, "MIN_ROWS_PER_THREAD", 50)
    generator = torch.Generator().manual_seed(num_queries * 10 + programs)
    keys = torch.randn(1000, 24, generator=generator)
    queries = torch.randn(num_queries, 24, generator=generator)
    keys = keys[torch.argsort(keys @ queries[0])]  # ascending scores for the first query
    values = torch.randn(1000, 7, generator=generator) if hetero else keys
    got = _fold(cpu_decode.decode_partials(queries, keys, values, scale=4.0, programs=programs))
    assert got.dtype == torch.float32
    torch.testing.assert_close(
        got.double(), _reference(queries, keys, values, 4.0), rtol=1e-5, atol=1e-5
    )


@pytest.fixture
def decode_on_small_memories(monkeypatch):
    """The CPU route for memories of any size, counted."""
    monkeypatch.setitem(attention.DECODE_KERNELS, "cpu", ("cpu_decode", 3, 0))
    monkeypatch.setitem(attention._DECODE["cpu_decode"], "failed", None)
    from nphcli.engine import cpu_decode

    calls: list = []
    inner = cpu_decode.decode_partials
    monkeypatch.setattr(
        cpu_decode, "decode_partials", lambda *a, **k: calls.append(1) or inner(*a, **k)
    )
    return calls


@pytest.mark.parametrize("num_queries", [1, 3, 4])
def test_dense_takes_the_kernel_for_up_to_three_queries(decode_on_small_memories, num_queries):
    generator = torch.Generator().manual_seed(3)
    keys = torch.nn.functional.normalize(torch.randn(3000, 32, generator=generator), dim=1)
    values = torch.randn(3000, 5, generator=generator)
    queries = keys[:num_queries] + 0.1 * torch.randn(num_queries, 32, generator=generator)
    got = create_model("dense", beta=8.0).retrieve(queries, keys, values=values).patterns
    torch.testing.assert_close(
        got.double(), _reference(queries, keys, values, 8.0), rtol=1e-5, atol=1e-6
    )
    assert len(decode_on_small_memories) == (1 if num_queries <= 3 else 0)


def test_float64_gradients_and_small_memories_keep_the_other_routes(decode_on_small_memories):
    keys = torch.randn(500, 16, dtype=torch.float64)
    bank = TensorBank(keys)
    assert not attention.decode_applies(keys[:1], bank)  # float64
    wants_grad = keys[:1].float().requires_grad_()
    assert not attention.decode_applies(wants_grad, TensorBank(keys.float()))
    assert attention.decode_applies(keys[:1].float(), TensorBank(keys.float()))
    small = ("cpu_decode", 3, 500 * 16 * 4 + 1)  # one byte more than these keys hold
    attention.DECODE_KERNELS["cpu"] = small
    assert not attention.decode_applies(keys[:1].float(), TensorBank(keys.float()))


def test_without_numba_the_fused_kernel_answers_silently(
    monkeypatch, caplog, decode_on_small_memories
):
    monkeypatch.setattr(attention, "installed", lambda package: False)
    keys = torch.randn(400, 16, generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.INFO, logger="nph"):
        got = create_model("dense", beta=2.0).retrieve(keys[:2], keys).patterns
    torch.testing.assert_close(
        got.double(), _reference(keys[:2], keys, keys, 2.0), rtol=1e-5, atol=1e-6
    )
    assert decode_on_small_memories == [] and caplog.text == ""


def test_a_failing_kernel_says_so_once_and_falls_back(
    monkeypatch, caplog, decode_on_small_memories
):
    def fail(*args, **kwargs):
        raise RuntimeError("numba could not compile")

    broken = types.SimpleNamespace(decode_partials=fail)
    monkeypatch.setitem(sys.modules, "nphcli.engine.cpu_decode", broken)
    keys = torch.randn(400, 16, generator=torch.Generator().manual_seed(2))
    with caplog.at_level(logging.WARNING, logger="nph"):
        for _ in range(2):
            got = create_model("dense", beta=2.0).retrieve(keys[:1], keys).patterns
    torch.testing.assert_close(
        got.double(), _reference(keys[:1], keys, keys, 2.0), rtol=1e-5, atol=1e-6
    )
    assert caplog.text.count("numba could not compile") == 1
    assert attention._DECODE["cpu_decode"]["failed"] is not None


def _decode_in_child(queries, keys, done) -> None:
    from nphcli.engine import cpu_decode

    partials = cpu_decode.decode_partials(queries, keys, keys, scale=1.0, programs=2)
    done.put(_fold(partials).tolist())  # plain numbers: a tensor would be shared by descriptor


def test_a_forked_child_runs_the_kernel_on_threads_of_its_own(monkeypatch):
    """The parent's thread pool is copied into a forked child without its threads: a child that
    used it would wait forever (the join's limit only keeps a broken run from hanging CI)."""
    import multiprocessing

    from nphcli.engine import cpu_decode

    monkeypatch.setattr(cpu_decode, "MIN_ROWS_PER_THREAD", 50)
    keys = torch.randn(400, 16, generator=torch.Generator().manual_seed(4))
    cpu_decode.decode_partials(keys[:1], keys, keys, scale=1.0, programs=2)  # the parent's pool
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    child = context.Process(target=_decode_in_child, args=(keys[:1], keys, done))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    got = torch.tensor(done.get(timeout=5), dtype=torch.float64)
    torch.testing.assert_close(got, _reference(keys[:1], keys, keys, 1.0), rtol=1e-5, atol=1e-6)
