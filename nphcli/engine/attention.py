"""Softmax attention over a memory bank, shared by `dense` (one head) and `multihead`.

    T(x) = concat_h V_hᵀ softmax(β K_h x_h),  heads h = 1..H on contiguous slices of d and d_v.

Three exact ways to compute it:

- one-shot, for resident memories where torch has a fused `scaled_dot_product_attention`
  kernel that pays (`fused_attention_chosen`): on the CPU a flash-attention kernel (online
  softmax over tiles that stay in cache), on CUDA flash attention for half dtypes and head
  sizes ≤ 256 (multihead; heads padded to a multiple of 8 with zeros, `aligned_head_width`).
  It never forms the (Q, M) score matrix and reads each key and value tile once; it beats the
  two matrix products X·Kᵀ and P·V run one after the other.
- one pass for one query on CUDA (`decode_applies`): a Triton kernel reads each memory row once
  for its score and its share of the weighted sum.
- blockwise, for anything else (memories streamed from disk, d = 784 on a GPU, or d_v ≠ d):
  online softmax (`SoftmaxAccumulator`) over memory blocks of `block_rows`, each block one
  X·K_bᵀ and one P_b·V_b product around one elementwise step (`blocks.exp_step`: in place, or
  one Triton kernel on CUDA). A memory resident on the device is read as views, so one query
  takes all of it in one block (`planning.bank_block_row_bytes`).

Both equal the softmax formula up to float rounding (tests compare them in float64).

The masked models use the same online softmax with a per-block mask (`masked_attention`), or,
when each query keeps few memories, read only those (`gathered_attention`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F  # noqa: N812  (torch's own convention)
from torch import Tensor

from nphcli.engine.blocks import SoftmaxAccumulator, triton_or_none
from nphcli.engine.planning import (
    BLOCK_ALIGN,
    Plan,
    itemsize,
    note_over_budget,
    plan_blocks,
)
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
    """concat_h V_hᵀ softmax(β K_h x_h) for queries (Q, d): shape (Q, d_v). `fused` is what
    `fused_heads` returned for this bank and block_rows, made once per retrieve by the model's
    `prepare` (padded heads are a copy of the memories): the fused kernel's inputs, or None
    for the blockwise route."""
    num_queries = queries.shape[0]
    x = queries.reshape(num_queries, heads, -1).transpose(0, 1)  # (H, Q, d/H)
    if fused is not None:
        k, v = fused  # (H, M, W_k), (H, M, W_v): W ≥ the head width, zero columns beyond it
        if k.shape[-1] > x.shape[-1]:  # zero columns add exactly 0 to every score
            x = F.pad(x, (0, k.shape[-1] - x.shape[-1]))  # (H, Q, W_k)
        out = F.scaled_dot_product_attention(x[None], k[None], v[None], scale=beta)[0]
        out = out[..., : bank.value_dim // heads]  # (H, Q, d_v/H): padded columns dropped
        return out.transpose(0, 1).reshape(num_queries, -1)  # (Q, d_v)
    acc = SoftmaxAccumulator(
        num_queries,
        bank.value_dim // heads,
        device=queries.device,
        dtype=accumulation_dtype(queries.dtype),
        batch=(heads,),
    )
    one_pass = heads == 1 and block_rows >= bank.num_memories and decode_applies(queries, bank)
    if not (one_pass and _decode(queries, bank, beta, acc)):
        scaled, rest = scale_queries(x, beta)  # (H, Q, d/H) and what β leaves for the scores
        for _, keys, values in bank.blocks(block_rows):
            k, v = _split_heads(keys, heads), _split_heads(values, heads)  # (H, B, ·)
            scores = matmul(scaled, k.transpose(1, 2))  # (H, Q, B), times rest in the step
            acc.add(scores, v, complete=True, scale=rest)
    acc.merge(bank.collective)
    return acc.result().transpose(0, 1).reshape(num_queries, -1)  # (Q, d_v)


# Queries that take the one-pass decode kernel on CUDA: each reads the memories once, so past
# one query two matrix products (which read them once for all queries) are as fast or faster
# (H100, M = 10⁶, d = 784: bfloat16 Q = 2 took 2.9 ms by the kernel, 1.7 ms by two products).
DECODE_MAX_QUERIES = 1
DECODE_DEVICES = ("cuda",)
DECODE_PROGRAMS_PER_SM = 4  # slices of the memories per multiprocessor: enough loads in flight
DECODE_MAX_WIDTH = 4096  # d or d_v beyond this would spill the kernel's registers
_DECODE: dict[str, str | None] = {"failed": None}


def decode_applies(queries: Tensor, bank: MemoryBank) -> bool:
    """Whether `softmax_attention` reads the memories once with the decode kernel
    (`triton_kernels.decode_partials`): up to `DECODE_MAX_QUERIES` queries, memories resident
    on a CUDA device in a float32 or half dtype, nothing to differentiate."""
    whole = bank.resident()
    return (
        whole is not None
        and _DECODE["failed"] is None
        and queries.device.type in DECODE_DEVICES
        and queries.shape[0] <= DECODE_MAX_QUERIES
        and queries.dtype in (torch.float32, *HALF_DTYPES)
        and whole[0].dtype == queries.dtype == whole[1].dtype
        and whole[0].is_contiguous()
        and whole[1].is_contiguous()
        and max(whole[0].shape[1], whole[1].shape[1]) <= DECODE_MAX_WIDTH
        and not (queries.requires_grad or whole[0].requires_grad or whole[1].requires_grad)
    )


def _decode(queries: Tensor, bank: MemoryBank, beta: float, acc: SoftmaxAccumulator) -> bool:
    """Fold the decode kernel's per-slice sums into `acc` (one head); False if the kernel is
    unavailable (the caller then runs the blockwise products)."""
    keys, values = bank.resident()
    partials = triton_or_none(
        _DECODE,
        "the one-pass decode kernel",
        lambda kernels: kernels.decode_partials(
            queries, keys, values, scale=beta, programs=_decode_programs(queries.device)
        ),
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
        return 8  # Triton's CPU interpreter (tests)
    return DECODE_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def attention_plan(
    num_queries: int, bank: MemoryBank, budget: int, *, heads: int, row_bytes: int
) -> Plan:
    """The fused kernel's working memory does not grow with M, so in RAM it takes all memories
    at once. Blockwise, each (query, memory) pair of a block holds, per head, its score in the
    accumulation dtype and its weight: the same buffer in place (float32, float64), or a fresh
    half copy for the product with half values, or a fresh tensor from the Triton step
    (`blocks.exp_step`); counting both covers each. Half inputs are planned under half the
    budget (`HopfieldModel.retrieve`), so their count errs on the safe side.

    Heads the fused kernel reads padded (`fused_heads`) cost a copy of the memories: it is
    counted, and where it does not fit the budget the bank runs blockwise."""
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
        # The padded copy does not fit: blockwise, in two blocks at least, since `fused_heads`
        # pads wherever a plan takes all M memories at once.
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
    on the CPU whenever torch would pick a fused kernel; on CUDA, for `unmasked` attention only,
    when torch picks its flash or cuDNN kernel (half dtypes, head size ≤ 256: multihead) for
    the heads padded to `aligned_head_width`.

    Chosen per device by measurement: on the CPU the fused kernel beats the two matrix products;
    on CUDA at d = 784 torch's flash kernels do not apply (head size > 256) and its
    memory-efficient kernel took 458 ms against the blockwise path's 82 ms (H200, Q = 1024,
    M = 10⁶), so CUDA takes only the flash-type kernels. The answer depends on the bank and H
    alone, never on the query batch, so `attention_plan` and `softmax_attention` always agree:
    a plan that takes all M memories at once is only made for a kernel that never forms the
    (Q, M) scores, which keeps `--memory-budget` honest.
    """
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


# Devices whose fused kernel (torch's CUDA flash and cuDNN attention) takes only head widths
# that are multiples of FLASH_HEAD_ALIGN; nph pads the heads there (`aligned_head_width`).
PAD_HEAD_DEVICES = ("cuda",)
FLASH_HEAD_ALIGN = 8


def aligned_head_width(width: int, device: torch.device) -> int:
    """The width of the heads the fused kernel reads, for heads of `width` on `device`: on CUDA
    the next multiple of FLASH_HEAD_ALIGN, since flash attention's kernels take only such head
    widths (for others torch pads every memory on every call itself, or runs its slower
    memory-efficient kernel: d = 784 with H = 4 gives heads of 196). Zero columns appended to
    queries, keys and values add exactly 0 to every score, and the output's extra columns are
    dropped, so the result is the same up to the kernel's rounding. The CPU's kernel takes any
    width."""
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
    """The keys and values (H, M, W_k), (H, M, W_v) that `softmax_attention`'s fused kernel
    reads: views of the memories, or zero-padded copies where their heads are narrower than
    `aligned_head_width` (one copy where the values are the keys). None where it runs
    blockwise (a plan with memory blocks shorter than M, or no fused kernel chosen)."""
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
    """rows (N, H·w) as H heads (H, N, width): a view where width = w, else a copy with
    width − w zero columns after each head's w."""
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


def fused_attention_available(x: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether `scaled_dot_product_attention` would run a fused (flash, memory-efficient or
    cuDNN) kernel on these inputs rather than its math fallback, which forms the score matrix."""
    return fused_attention_choice(x, k, v) not in (None, SDPA_MATH)


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
    """Vᵀ softmax(β K x) restricted to the memories that `keep(start, rows)` admits, one memory
    block at a time: keep returns a (Q, rows) bool mask for memories start .. start + rows − 1.
    Online softmax with excluded scores at −inf gives them weight exactly 0. Returns the
    patterns (Q, d_v) and how many memories each query kept (Q,)."""
    acc = SoftmaxAccumulator(
        queries.shape[0],
        bank.value_dim,
        device=queries.device,
        dtype=accumulation_dtype(queries.dtype),
    )
    scaled, rest = scale_queries(queries, beta)  # (Q, d)
    for start, keys, values in bank.blocks(block_rows):
        scores = matmul(scaled, keys.T, scale=rest)  # (Q, B)
        acc.add(scores.masked_fill(~keep(start, keys.shape[0]), -torch.inf), values)
    acc.merge(bank.collective)
    return acc.result(), acc.support


def gathered_attention(
    queries: Tensor, bank: MemoryBank, index: Tensor, valid: Tensor | None, *, beta: float
) -> Tensor:
    """Vᵀ softmax(β K x) over the memories index (Q, c) of each query (where `valid` (Q, c), if
    given, is true): only those c keys and values are read, with no work over the other M − c."""
    keys, values = bank.gather(index)  # (Q, c, d), (Q, c, d_v)
    scaled, rest = scale_queries(queries, beta)  # (Q, d)
    scores = matmul(keys, scaled.unsqueeze(2), scale=rest).squeeze(2)  # (Q, c)
    if valid is not None:
        scores = scores.masked_fill(~valid, -torch.inf)
    weights = torch.softmax(scores, dim=1)  # (Q, c)
    return matmul(weights.unsqueeze(1), values).squeeze(1)  # (Q, d_v)
