"""Heads padded for the fused kernel (`attention.aligned_head_width`, `fused_heads`): on CUDA the
flash kernels take head widths that are multiples of 8, so nph appends zero columns to each
head's queries, keys and values and drops the output's extra columns. Here the padding route is
forced on the device under test (`PAD_HEAD_DEVICES`, the CPU by default) and compared with the
unpadded route and with softmax per head slice written from the formula."""

from __future__ import annotations

import pytest
import torch

from nphcli.engine import attention
from nphcli.engine.planning import Plan
from nphcli.memory.bank import TensorBank
from nphcli.models import create_model

BETA = 3.0
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}


def _reference(queries, keys, values, heads: int, beta: float) -> torch.Tensor:
    """concat_h softmax(β X_h K_hᵀ) V_h in float64, head h on slice h of d and of d_v."""
    x, k, v = queries.double(), keys.double(), values.double()
    width, value_width = k.shape[1] // heads, v.shape[1] // heads
    outs = []
    for h in range(heads):
        scores = x[:, h * width : (h + 1) * width] @ k[:, h * width : (h + 1) * width].T  # (Q, M)
        weights = torch.softmax(beta * scores, dim=1)  # (Q, M)
        outs.append(weights @ v[:, h * value_width : (h + 1) * value_width])  # (Q, d_v/H)
    return torch.cat(outs, dim=1)  # (Q, d_v)


def _inputs(dim: int, value_dim: int | None, dtype, device):
    generator = torch.Generator().manual_seed(dim)
    keys = torch.nn.functional.normalize(torch.randn(300, dim, generator=generator), dim=1)
    queries = keys[:20] + 0.3 * torch.randn(20, dim, generator=generator)  # (Q, d)
    values = None if value_dim is None else torch.randn(300, value_dim, generator=generator)
    move = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return move(queries), move(keys), move(values)


@pytest.fixture
def sdpa_widths(monkeypatch):
    """The key head width of every scaled_dot_product_attention call, recorded."""
    widths: list[int] = []
    inner = torch.nn.functional.scaled_dot_product_attention

    def recorded(q, k, v, **kwargs):
        widths.append(k.shape[-1])
        return inner(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded)
    return widths


@pytest.mark.parametrize(
    ("dim", "heads", "value_dim", "padded_width"),
    [
        (784, 4, None, 200),  # MNIST's d with 4 heads: heads of 196
        (28, 4, None, 8),  # heads of 7
        (28, 4, 28, 8),  # hetero values: keys and values padded apart
        (32, 4, None, 8),  # heads of 8: already aligned, read as views
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_padded_heads_equal_unpadded_and_the_formula(
    monkeypatch, sdpa_widths, device, dim, heads, value_dim, padded_width, dtype
):
    queries, keys, values = _inputs(dim, value_dim, dtype, device)
    model = create_model("multihead", beta=BETA, heads=heads)
    monkeypatch.setattr(attention, "PAD_HEAD_DEVICES", ())
    unpadded = model.retrieve(queries, keys, values).patterns
    monkeypatch.setattr(attention, "PAD_HEAD_DEVICES", (device.type,))
    sdpa_widths.clear()
    padded = model.retrieve(queries, keys, values).patterns
    bank = TensorBank(keys, values)
    chosen = attention.fused_attention_chosen(bank, heads, unmasked=True)
    assert chosen or device.type != "cpu"  # the CPU's kernel takes float32 and float64
    assert sdpa_widths == ([padded_width] if chosen else [])
    reference = _reference(queries, keys, keys if values is None else values, heads, BETA)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(padded.double(), reference, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(padded, unpadded, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(
    ("dim", "value_dim", "copied"), [(784, None, 1), (28, None, 1), (28, 28, 2), (32, None, 0)]
)
def test_fused_heads_pad_with_zeros_and_copy_only_what_needs_it(
    monkeypatch, device, dim, value_dim, copied
):
    """Keys padded with zero columns after each head (values that are the keys share the
    copy); aligned heads are views of the memories, and no copy is counted for them."""
    monkeypatch.setattr(attention, "PAD_HEAD_DEVICES", (device.type,))
    _, keys, values = _inputs(dim, value_dim, torch.float32, device)
    bank = TensorBank(keys, values)
    width = dim // 4
    padded = attention.aligned_head_width(width, device)
    k, v = attention.fused_heads(bank, 4, bank.num_memories)  # (H, M, W)
    assert k.shape == (4, bank.num_memories, padded)
    torch.testing.assert_close(k[..., :width], keys.reshape(-1, 4, width).transpose(0, 1))
    assert not k[..., width:].any()
    assert (v is k) == (value_dim is None)
    shares = [t.untyped_storage().data_ptr() == keys.untyped_storage().data_ptr() for t in (k, v)]
    assert shares == [copied == 0, copied == 0]
    row_copy = 4 * padded * keys.element_size()
    assert attention.padded_copy_bytes(bank, 4) == copied * bank.num_memories * row_copy


def test_plan_counts_the_copy_and_runs_blockwise_where_it_does_not_fit(
    monkeypatch, sdpa_widths, device
):
    """A budget that holds the padded copy plans all M memories at once and pads; a smaller
    one plans blocks shorter than M, so no copy is made, and the result is the same."""
    monkeypatch.setattr(attention, "PAD_HEAD_DEVICES", (device.type,))
    queries, keys, _ = _inputs(28, None, torch.float64, device)
    bank = TensorBank(keys)
    copy = attention.padded_copy_bytes(bank, 4)
    row_bytes = 1024
    model = create_model("multihead", beta=BETA, heads=4)
    reference = _reference(queries, keys, keys, 4, BETA)
    if not attention.fused_attention_chosen(bank, 4, unmasked=True):
        pytest.skip("no fused kernel for float64 on this device")
    for budget, fused in [(16 * copy, True), (copy // 2, False)]:
        plan = attention.attention_plan(20, bank, budget, heads=4, row_bytes=row_bytes)
        assert (plan.memory_rows >= bank.num_memories) is fused
        assert (attention.fused_heads(bank, 4, plan.memory_rows) is not None) is fused
        if fused:  # the copy, then each query's row and its padded query and output
            padded_row = row_bytes + 4 * 2 * 8 * keys.element_size()
            assert copy + plan.query_rows * padded_row <= budget
        sdpa_widths.clear()
        got = model.retrieve(queries, keys, memory_budget=budget).patterns
        assert sdpa_widths == ([8] if fused else [])
        torch.testing.assert_close(got, reference, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("name", "heads"), [("dense", 1), ("multihead", 4)])
def test_the_padded_copy_is_made_once_per_retrieve(monkeypatch, device, name, heads):
    """Several query batches and two iteration steps read one padded copy, made by the model's
    `prepare`: a copy per batch and step would cost a pass over all memories each time."""
    monkeypatch.setattr(attention, "PAD_HEAD_DEVICES", (device.type,))
    queries, keys, _ = _inputs(28, None, torch.float64, device)
    if not attention.fused_attention_chosen(TensorBank(keys), heads, unmasked=True):
        pytest.skip("no fused kernel for float64 on this device")
    copies = []
    inner = attention._padded_heads

    def counted(rows, heads, width):
        out = inner(rows, heads, width)
        copies.append(out.untyped_storage().data_ptr() != rows.untyped_storage().data_ptr())
        return out

    monkeypatch.setattr(attention, "_padded_heads", counted)
    model = create_model(name, beta=BETA, steps=2, **({"heads": heads} if heads > 1 else {}))
    plan = Plan(query_rows=6, memory_rows=keys.shape[0])  # 4 batches of the 20 queries
    got = model.retrieve(queries, keys, plan=plan).patterns
    assert copies == [True]
    once = create_model(name, beta=BETA, **({"heads": heads} if heads > 1 else {}))
    expected = once.retrieve(once.retrieve(queries, keys).patterns, keys).patterns
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
