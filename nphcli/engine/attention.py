"""Softmax attention over a memory bank, shared by `dense` (one head) and `multihead`.

    T(x) = concat_h V_hᵀ softmax(β K_h x_h),  heads h = 1..H on contiguous slices of d and d_v.

Three exact ways, equal to the formula up to rounding (tests compare them in float64):

- one-shot: torch's fused `scaled_dot_product_attention` where it pays
  (`fused_attention_chosen`); it never forms the (Q, M) scores.
- one pass for a few queries (`decode_applies`): each row read once, for its scores and its
  share of the sum; a Triton kernel on CUDA, numba on the CPU (the `fast` extra).
- blockwise for anything else: online softmax (`SoftmaxAccumulator`) over memory blocks.

Masked models use the online softmax with a per-block mask (`masked_attention`), or read only
the few memories each query keeps (`gathered_attention`).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor

from nphcli.engine.blocks import SoftmaxAccumulator, triton_or_none
from nphcli.engine.planning import BLOCK_ALIGN, Plan, itemsize, note_over_budget, plan_blocks
from nphcli.engine.precision import HALF_DTYPES, accumulation_dtype, matmul, scale_queries
from nphcli.memory.bank import MemoryBank


def softmax_attention(
    queries: Tensor,
    bank: MemoryBank,
    *,
    beta: float,
    heads: int,
    block_rows: int,
    fused: tuple[Tensor, Tensor] | None,
) -> Tensor:
    """concat_h V_hᵀ softmax(β K_h x_h) for queries (Q, d): (Q, d_v). `fused`: `fused_heads`'s
    answer (the model's `prepare`), None for the blockwise route."""
    num_queries = queries.shape[0]
    x = queries.reshape(num_queries, heads, -1).transpose(0, 1)  # (H, Q, d/H)
    dtype, width = accumulation_dtype(queries.dtype), bank.value_dim // heads
    acc = SoftmaxAccumulator(num_queries, width, device=queries.device, dtype=dtype, batch=(heads,))
    one_pass = heads == 1 and block_rows >= bank.num_memories and decode_applies(queries, bank)
    if not (one_pass and _decode(queries, bank, beta, acc)):
        if fused is not None:
            return _fused_attention(x, fused, width, beta)
        scaled, rest = scale_queries(x, beta)  # (H, Q, d/H) and what β leaves for the scores
        for _, keys, values in bank.blocks(block_rows):
            k, v = _split_heads(keys, heads), _split_heads(values, heads)  # (H, B, ·)
            scores = matmul(scaled, k.transpose(1, 2))  # (H, Q, B), times rest in the step
            acc.add(scores, v, complete=True, scale=rest)
    acc.merge(bank.collective)
    return acc.result().transpose(0, 1).reshape(num_queries, -1)  # (Q, d_v)


def _fused_attention(x: Tensor, fused: tuple[Tensor, Tensor], value_width: int, beta: float):
    """torch's fused kernel on the heads `fused_heads` prepared: (Q, d_v)."""
    k, v = fused  # (H, M, W_k), (H, M, W_v): W ≥ the head width, zero columns beyond it
    if k.shape[-1] > x.shape[-1]:  # zero columns add exactly 0 to every score
        x = F.pad(x, (0, k.shape[-1] - x.shape[-1]))  # (H, Q, W_k)
    out = F.scaled_dot_product_attention(x[None], k[None], v[None], scale=beta)[0]
    out = out[..., :value_width]  # (H, Q, d_v/H): padded columns dropped
    return out.transpose(0, 1).reshape(x.shape[1], -1)  # (Q, d_v)


# Per device type: the module whose `decode_partials` reads each row once, the most queries for
# which it pays, and the fewest bytes of memories. CUDA: past one query two matrix products win
# (H100, M = 10⁶, d = 784, bfloat16, Q = 2: 2.9 ms by the decode kernel, 1.7 ms by the products).
# CPU (one thread, M = 60,000, d = 784): 1.2 × one GEMV at Q = 1 where torch's fused kernel
# takes 1.4–1.5 ×, 0.72–0.75 × that kernel's time at Q = 2–3, 1.05 × at Q = 4
# (docs/performance.md); numba's first call in a process takes 0.5 s, repaid only by many
# calls on large memories.
DECODE_KERNELS = {"cuda": ("triton_kernels", 1, 0), "cpu": ("cpu_decode", 3, 2**26)}
DECODE_PROGRAMS_PER_SM = 4  # slices of the memories per multiprocessor: enough loads in flight
DECODE_MAX_WIDTH = 4096  # d or d_v beyond this would spill the kernel's registers
_DECODE: dict[str, dict[str, str | None]] = {
    "triton_kernels": {"failed": None},
    "cpu_decode": {"failed": None},
}
_NEEDS = {"triton_kernels": "triton", "cpu_decode": "numba"}


def decode_applies(queries: Tensor, bank: MemoryBank) -> bool:
    """Whether `softmax_attention` runs a decode kernel (`DECODE_KERNELS`): installed, not
    failed before, few enough queries, enough memories, and dtypes it takes (CPU: float32)."""
    whole = bank.resident()
    module, max_queries, min_bytes = DECODE_KERNELS.get(queries.device.type, ("", 0, 0))
    dtypes = (torch.float32,) if module == "cpu_decode" else (torch.float32, *HALF_DTYPES)
    return (
        whole is not None
        and 0 < queries.shape[0] <= max_queries
        and bank.num_memories * bank.dim * itemsize(bank.dtype) >= min_bytes  # the keys
        and _DECODE[module]["failed"] is None
        and installed(_NEEDS[module])
        and queries.dtype in dtypes
        and whole[0].dtype == queries.dtype == whole[1].dtype
        and whole[0].is_contiguous()
        and whole[1].is_contiguous()
        and max(whole[0].shape[1], whole[1].shape[1]) <= DECODE_MAX_WIDTH
        and not (queries.requires_grad or whole[0].requires_grad or whole[1].requires_grad)
    )


@functools.cache
def installed(package: str) -> bool:
    """Whether an optional package is there, without importing it (numba takes 0.3 s)."""
    return importlib.util.find_spec(package) is not None


def _decode(queries: Tensor, bank: MemoryBank, beta: float, acc: SoftmaxAccumulator) -> bool:
    """Fold the decode kernel's per-slice sums into `acc`; False if the kernel is unavailable."""
    keys, values = bank.resident()
    module = DECODE_KERNELS[queries.device.type][0]
    partials = triton_or_none(
        _DECODE[module],
        "the one-pass decode kernel",
        lambda kernels: kernels.decode_partials(
            queries, keys, values, scale=beta, programs=_decode_programs(queries.device)
        ),
        module,
    )
    if partials is None:
        return False
    best, norm, total = partials  # (P, Q), (P, Q), (P, Q, d_v)
    top = best.amax(dim=0)  # (Q,)
    rescale = torch.exp(best - top)  # (P, Q)
    acc.support += bank.num_memories
    acc.fold(
        top[None],
        top[None],
        (norm * rescale).sum(0)[None],
        (total * rescale[..., None]).sum(0)[None],
    )
    return True


def _decode_programs(device: torch.device) -> int:
    if device.type != "cuda":
        return torch.get_num_threads()
    return DECODE_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def attention_plan(
    num_queries: int, bank: MemoryBank, budget: int, *, heads: int, row_bytes: int
) -> Plan:
    """All M at once for the fused kernel (its working memory does not grow with M) with the
    padded copy `fused_heads` makes; blockwise, a score and a weight per pair and head."""
    if fused_attention_chosen(bank, heads, unmasked=True):
        copy = padded_copy_bytes(bank, heads)
        if copy == 0:
            query_rows = max(1, min(num_queries, budget // row_bytes))
            note_over_budget(budget, query_rows * row_bytes, "one query")
            return Plan(query_rows=query_rows, memory_rows=bank.num_memories)
        key_width, value_width = _fused_widths(bank, heads)
        padded_row = row_bytes + heads * (key_width + value_width) * itemsize(bank.dtype)
        if copy + padded_row <= budget:  # (per query: its padded x and output as well)
            query_rows = min(num_queries, (budget - copy) // padded_row)
            return Plan(query_rows=query_rows, memory_rows=bank.num_memories)
        # Blockwise in two blocks at least: `fused_heads` pads wherever a plan takes all M.
        plan = _blockwise_plan(num_queries, bank, budget, heads=heads, row_bytes=row_bytes)
        rows = min(plan.memory_rows, bank.num_memories - 1)
        rows -= rows % BLOCK_ALIGN if rows >= BLOCK_ALIGN else 0
        return Plan(query_rows=plan.query_rows, memory_rows=max(1, rows))
    return _blockwise_plan(num_queries, bank, budget, heads=heads, row_bytes=row_bytes)


def _blockwise_plan(
    num_queries: int, bank: MemoryBank, budget: int, *, heads: int, row_bytes: int
) -> Plan:
    cell_bytes = heads * (itemsize(accumulation_dtype(bank.dtype)) + itemsize(bank.dtype))
    return plan_blocks(num_queries, bank, budget, row_bytes=row_bytes, cell_bytes=cell_bytes)


def fused_attention_chosen(bank: MemoryBank, heads: int, *, unmasked: bool = False) -> bool:
    """Whether `softmax_attention` runs torch's fused kernel on this bank (resident memories):
    on the CPU whenever torch picks a fused kernel; on CUDA, `unmasked` only, when it picks
    flash or cuDNN for the heads padded to `aligned_head_width` (its memory-efficient kernel
    took 458 ms against blockwise's 82, H200, Q = 1024, M = 10⁶). It depends on the bank and H
    alone, so `attention_plan` and `softmax_attention` always agree."""
    whole = bank.resident()
    on_cpu = bank.device.type == "cpu"
    if whole is None or not (on_cpu or unmasked):  # (CUDA: masked attention stays blockwise)
        return False
    key_width, value_width = _fused_widths(bank, heads)
    probe = whole[0].new_empty(1, heads, 1, key_width)  # (1, H, 1, W_k)
    if (key_width * heads, value_width * heads) == (bank.dim, bank.value_dim):  # views
        k, v = _split_heads(whole[0], heads)[None], _split_heads(whole[1], heads)[None]
    else:  # the padded copies' shape, one row standing in for M: (1, H, 1, W_k), (1, H, 1, W_v)
        k, v = probe, whole[1].new_empty(1, heads, 1, value_width)
    choice = fused_attention_choice(probe, k, v)
    if on_cpu:
        return choice not in (None, SDPA_MATH)
    return choice in (SDPA_FLASH, SDPA_CUDNN)


# Devices whose flash and cuDNN kernels take only head widths that are multiples of this.
PAD_HEAD_DEVICES = ("cuda",)
FLASH_HEAD_ALIGN = 8


def aligned_head_width(width: int, device: torch.device) -> int:
    """The head width the fused kernel reads: on CUDA the next multiple of FLASH_HEAD_ALIGN
    (zero columns add 0 to every score and are dropped from the output)."""
    if device.type not in PAD_HEAD_DEVICES:
        return width
    return -(-width // FLASH_HEAD_ALIGN) * FLASH_HEAD_ALIGN


def _fused_widths(bank: MemoryBank, heads: int) -> tuple[int, int]:
    """The key and value head widths W_k, W_v the fused kernel reads on this bank."""
    key_width, value_width = (
        aligned_head_width(width // heads, bank.device) for width in (bank.dim, bank.value_dim)
    )
    return key_width, value_width


def fused_heads(bank: MemoryBank, heads: int, block_rows: int) -> tuple[Tensor, Tensor] | None:
    """The keys and values (H, M, W_k), (H, M, W_v) the fused kernel reads (views, or padded
    copies); None where `softmax_attention` runs blockwise."""
    if block_rows < bank.num_memories or not fused_attention_chosen(bank, heads, unmasked=True):
        return None
    keys, values = bank.resident()
    key_width, value_width = _fused_widths(bank, heads)
    k = _padded_heads(keys, heads, key_width)  # (H, M, W_k)
    v = k if values is keys else _padded_heads(values, heads, value_width)  # (H, M, W_v)
    return k, v


def padded_copy_bytes(bank: MemoryBank, heads: int) -> int:
    """Bytes of the padded copies `fused_heads` makes (0 where it reads views)."""
    keys, values = bank.resident()
    key_width, value_width = _fused_widths(bank, heads)
    padded = [key_width] if key_width * heads != bank.dim else []
    if values is not keys and value_width * heads != bank.value_dim:
        padded.append(value_width)
    return bank.num_memories * heads * sum(padded) * itemsize(bank.dtype)


def _padded_heads(rows: Tensor, heads: int, width: int) -> Tensor:
    """rows (N, H·w) as heads (H, N, width), zero-padded past w."""
    split = _split_heads(rows, heads)  # (H, N, w)
    if split.shape[-1] == width:
        return split
    return F.pad(split, (0, width - split.shape[-1]))  # (H, N, width)


try:  # torch's numbers for its SDPA kernels (torch 2.3 and later)
    from torch.nn.attention import SDPBackend

    SDPA_MATH, SDPA_FLASH, SDPA_CUDNN = (
        int(SDPBackend.MATH),
        int(SDPBackend.FLASH_ATTENTION),
        int(SDPBackend.CUDNN_ATTENTION),
    )
except (ImportError, AttributeError):  # older torch: its choice is not read (taken as none)
    SDPA_MATH = SDPA_FLASH = SDPA_CUDNN = None


def fused_attention_choice(x: Tensor, k: Tensor, v: Tensor) -> int | None:
    """The SDPA kernel torch's dispatcher would pick for these inputs (`SDPA_*`), or None."""
    if k.shape[-1] != v.shape[-1] or SDPA_MATH is None:  # (one head size for keys and values)
        return None
    try:  # torch's own dispatcher decision; private, so guarded
        return int(torch._fused_sdp_choice(x, k, v, scale=1.0))
    except (AttributeError, RuntimeError):
        return None


def _split_heads(rows: Tensor, heads: int) -> Tensor:
    return rows.reshape(rows.shape[0], heads, -1).transpose(0, 1)  # (H, rows, width/H)


def masked_attention(
    queries: Tensor,
    bank: MemoryBank,
    keep: Callable[[int, int], Tensor],
    *,
    beta: float,
    block_rows: int,
) -> tuple[Tensor, Tensor]:
    """Vᵀ softmax(β K x) over the memories `keep(start, rows)` (Q, rows) admits, block by
    block: the patterns (Q, d_v) and how many memories each query kept (Q,)."""
    dtype = accumulation_dtype(queries.dtype)
    acc = SoftmaxAccumulator(queries.shape[0], bank.value_dim, device=queries.device, dtype=dtype)
    scaled, rest = scale_queries(queries, beta)  # (Q, d)
    for start, keys, values in bank.blocks(block_rows):
        scores = matmul(scaled, keys.T, scale=rest)  # (Q, B)
        acc.add(scores.masked_fill(~keep(start, keys.shape[0]), -torch.inf), values)
    acc.merge(bank.collective)
    return acc.result(), acc.support


def gathered_attention(
    queries: Tensor, bank: MemoryBank, index: Tensor, valid: Tensor | None, *, beta: float
) -> Tensor:
    """Vᵀ softmax(β K x) over each query's memories index (Q, c) (where `valid`), reading
    only those."""
    keys, values = bank.gather(index)  # (Q, c, d), (Q, c, d_v)
    scaled, rest = scale_queries(queries, beta)  # (Q, d)
    scores = matmul(keys, scaled.unsqueeze(2), scale=rest).squeeze(2)  # (Q, c)
    if valid is not None:
        scores = scores.masked_fill(~valid, -torch.inf)
    weights = torch.softmax(scores, dim=1)  # (Q, c)
    return matmul(weights.unsqueeze(1), values).squeeze(1)  # (Q, d_v)
