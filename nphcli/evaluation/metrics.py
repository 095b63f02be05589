"""Retrieval metrics per query, and their summaries: `sse`, `mse`, `cosine`, `nearest` and
`nearest_distance`, `success`, `pixel_success`, `support` and `steps`, defined in
docs/retrieving.md, "Metrics" (each function below states its formula). All are computed in
float32 (float64 for float64 inputs), whatever the retrieval dtype, and the nearest-pattern
search runs over blocks of memories, never forming a full (Q, M) matrix.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from nphcli.memory.bank import MemoryBank, as_bank
from nphcli.memory.collective import Collective

# Elements of one (queries × memories) distance block: 2²⁴ float32 = 64 MiB.
BLOCK_ELEMENTS = 1 << 24
# Largest |clamp(y_i) − t_i| a `pixel_success` allows, in the stored units.
PIXEL_TOLERANCE = 0.1


def metric_dtype(tensor: Tensor | torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for everything else (including half precision);
    `tensor` is a tensor or its dtype."""
    dtype = tensor if isinstance(tensor, torch.dtype) else tensor.dtype
    return torch.float64 if dtype == torch.float64 else torch.float32


def sse(retrieved: Tensor, targets: Tensor) -> Tensor:
    """(Q,) sum of squared differences ‖y − t‖² per row of `retrieved` and `targets` (Q, d_v)."""
    dtype = metric_dtype(retrieved)
    diff = retrieved.to(dtype) - targets.to(device=retrieved.device, dtype=dtype)  # (Q, d_v)
    return (diff * diff).sum(dim=1)


def cosine(retrieved: Tensor, targets: Tensor) -> Tensor:
    """(Q,) ⟨y, t⟩ / (‖y‖·‖t‖) per row; 0 where either vector is zero (no NaN)."""
    dtype = metric_dtype(retrieved)
    y = retrieved.to(dtype)  # (Q, d_v)
    t = targets.to(device=retrieved.device, dtype=dtype)  # (Q, d_v)
    norms = torch.linalg.vector_norm(y, dim=1) * torch.linalg.vector_norm(t, dim=1)  # (Q,)
    dots = (y * t).sum(dim=1)  # (Q,)
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    return torch.where(norms > 0, dots / safe, torch.zeros_like(dots)).clamp(-1.0, 1.0)


def value_range(stored: Tensor | MemoryBank) -> tuple[float, float]:
    """(min, max) over every entry of the stored rows (M, d_v), read block by block (over every
    rank's rows when the memory is spread over ranks)."""
    bank = as_bank(stored)
    low, high = math.inf, -math.inf
    for _, _, values in bank.blocks(1 << 16):
        low, high = min(low, float(values.min())), max(high, float(values.max()))
    extremes = torch.tensor([-low, high], dtype=torch.float64)  # one message for both
    extremes = bank.collective.all_max(extremes.to(bank.device)).cpu()
    return -float(extremes[0]), float(extremes[1])


def pixel_success(
    retrieved: Tensor, targets: Tensor, low: float, high: float, tol: float = PIXEL_TOLERANCE
) -> Tensor:
    """(Q,) 1.0 where every entry of clamp(y, low, high) is within `tol` of the target, else 0."""
    dtype = metric_dtype(retrieved)
    y = retrieved.to(dtype).clamp(low, high)  # (Q, d_v)
    t = targets.to(device=retrieved.device, dtype=dtype)  # (Q, d_v)
    return ((y - t).abs().amax(dim=1) <= tol).to(dtype)


def nearest(
    points: Tensor,
    stored: Tensor | MemoryBank,
    *,
    block_elements: int = BLOCK_ELEMENTS,
    block_rows: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Index (Q,) int64 of the stored row nearest to each point, and that distance (Q,).

    `stored` is a tensor (M, d_v) or a `MemoryBank`, whose values are the stored rows (a
    streamed bank is read block by block, and only the nearest rows are read again).
    argmin_μ ‖p − s_μ‖², ties broken towards the lowest μ. Squared distances are ranked as
    ‖s_μ‖² − 2⟨p, s_μ⟩ (‖p‖² is the same for every μ) over blocks of queries × memories holding
    at most `block_elements` entries, and at most `block_rows` memories (default: no limit
    beyond `block_elements`). Matrix products round differently in different blocks,
    so scores within rounding of the minimum (16·√d·ε·(‖p‖² + max‖s‖²), ε the dtype's machine
    epsilon) count as ties: the nearest is the lowest index within rounding of the minimum, so
    equal stored rows always resolve to the lowest index, and where the blocks are cut does not
    change the answer (a point whose block minima come within rounding of each other is
    decided in a second pass, once the minimum over every block is known). The reported
    distance is then computed directly as ‖p − s_nearest‖: exact to rounding, and 0 for a
    point equal to a stored row.
    """
    bank = as_bank(stored)
    dtype = metric_dtype(points)
    device = points.device
    num_points, num_stored = points.shape[0], bank.num_memories
    relative = 16 * math.sqrt(points.shape[1]) * torch.finfo(dtype).eps
    memory_block = max(1, min(num_stored, block_elements, block_rows or num_stored))
    largest = bank.collective.all_max(
        torch.stack(
            [
                values.to(device=device, dtype=dtype).square().sum(dim=1).max()
                for _, _, values in bank.blocks(min(memory_block, 1 << 16))
            ]
        ).max()
    )  # max_μ ‖s_μ‖² over every rank's rows
    best = torch.empty(num_points, dtype=torch.int64, device=device)
    query_block = max(1, block_elements // memory_block)
    for q0 in range(0, num_points, query_block):
        p = points[q0 : q0 + query_block].to(dtype)  # (B, d_v)
        tol = relative * (p.square().sum(dim=1) + largest)  # (B,)
        best_score = torch.full((p.shape[0],), math.inf, dtype=dtype, device=device)  # (B,)
        best_index = torch.zeros(p.shape[0], dtype=torch.int64, device=device)  # (B,)
        unsure = torch.zeros(p.shape[0], dtype=torch.bool, device=device)  # (B,)
        for m0, _, values in bank.blocks(memory_block):
            scores = _squared_distances(p, values)  # (B, b), up to ‖p‖²
            block_score = scores.min(dim=1).values  # (B,)
            block_index = _first_within(scores, block_score + tol)  # (B,) lowest index
            better = block_score < best_score - tol  # every earlier row is out of reach now
            tie = (block_score - best_score).abs() <= tol  # decided again below
            unsure = (unsure & ~better) | tie
            best_index = torch.where(better, block_index + m0, best_index)
            best_score = torch.minimum(best_score, block_score)
        if bool(unsure.any()):
            rows = unsure.nonzero().squeeze(1)  # (U,)
            found = _lowest_within(p[rows], bank, best_score[rows] + tol[rows], memory_block)
            best_index[rows] = torch.where(found >= 0, found, best_index[rows])
        if bank.collective.world_size > 1:  # each rank's best, merged in row order
            best_index = _merge_ranks(bank.collective, best_score, best_index, tol)
        best[q0 : q0 + query_block] = best_index
    _, nearest_rows = bank.gather(best.to(bank.device))  # (Q, d_v)
    distance = torch.linalg.vector_norm(
        points.to(dtype) - nearest_rows.to(device=device, dtype=dtype), dim=1
    )  # (Q,)
    return best, distance


def _squared_distances(points: Tensor, values: Tensor) -> Tensor:
    """‖s‖² − 2⟨p, s⟩ (B, b) of points (B, d_v) to stored rows (b, d_v), in the points' dtype."""
    s = values.to(device=points.device, dtype=points.dtype)  # (b, d_v)
    return s.square().sum(dim=1)[None, :] - 2.0 * (points @ s.T)


def _first_within(scores: Tensor, limit: Tensor) -> Tensor:
    """Per row of scores (B, b), the first column at or below limit (B,); 0 where none is."""
    return (scores <= limit[:, None]).to(torch.uint8).argmax(dim=1)


def _lowest_within(points: Tensor, bank: MemoryBank, limit: Tensor, rows: int) -> Tensor:
    """The lowest stored index whose score is at or below limit (U,) for each point (U, d_v),
    over blocks of `rows` (the first pass's); -1 where none is. The second pass for points
    whose block minima came within rounding of each other, where comparing blocks in turn
    would depend on where the blocks are cut (rows 0.6 and 1.2 tol below a first one are each
    a tie of their neighbour, not of each other)."""
    found = torch.full((points.shape[0],), -1, dtype=torch.int64, device=points.device)  # (U,)
    for m0, _, values in bank.blocks(rows):
        scores = _squared_distances(points, values)  # (U, b)
        hit = (scores <= limit[:, None]).any(dim=1) & (found < 0)  # (U,)
        found = torch.where(hit, _first_within(scores, limit) + m0, found)
    return found


def _merge_ranks(
    collective: Collective, best_score: Tensor, best_index: Tensor, tol: Tensor
) -> Tensor:
    """The nearest row over all ranks from each rank's nearest (B,): ranks hold rows in rank
    order, so they are taken in turn with the same tie rule as memory blocks."""
    scores = collective.all_cat(best_score[:, None], dim=1)  # (B, W)
    index = collective.all_cat(best_index[:, None], dim=1)  # (B, W)
    chosen_score, chosen = scores[:, 0], index[:, 0]  # (B,)
    for rank in range(1, scores.shape[1]):
        better = scores[:, rank] < chosen_score - tol  # an earlier rank keeps a tie
        chosen = torch.where(better, index[:, rank], chosen)
        chosen_score = torch.minimum(chosen_score, scores[:, rank])
    return chosen


def per_query(
    retrieved: Tensor,
    stored: Tensor | MemoryBank,
    *,
    targets: Tensor | None = None,
    target_indices: Tensor | None = None,
    steps: Tensor | None = None,
    support: Tensor | None = None,
    block_rows: int | None = None,
    block_elements: int = BLOCK_ELEMENTS,
    stored_range: tuple[float, float] | None = None,
    pixels: bool = True,
) -> dict[str, Tensor]:
    """Every metric (module docstring) per query, as (Q,) tensors on `retrieved`'s device.

    `stored` (M, d_v) are the memories in the output space, as a tensor or as the values of a
    `MemoryBank` (`block_rows`, `block_elements`: see `nearest`). Error metrics need `targets`
    (Q, d_v); `success` needs the targets' stored indices: `target_indices` (Q,) if given,
    else the stored row nearest to each target. Without targets only `nearest`,
    `nearest_distance`, `support` and `steps` are returned. `stored_range` is the stored values'
    (min, max) when the caller already knows it (else one more pass over `stored` finds it).
    `pixels`: whether the outputs are images, so that `pixel_success` means something (False
    for plain vectors: it is left out).
    """
    out: dict[str, Tensor] = {}
    blocks = {"block_rows": block_rows, "block_elements": block_elements}
    index, distance = nearest(retrieved, stored, **blocks)
    out["nearest"] = index
    out["nearest_distance"] = distance
    if targets is not None:
        errors = sse(retrieved, targets)
        out["sse"] = errors
        out["mse"] = errors / retrieved.shape[1]
        out["cosine"] = cosine(retrieved, targets)
        if target_indices is None:
            target_indices, _ = nearest(targets.to(retrieved.device), stored, **blocks)
        out["target_index"] = target_indices.to(device=index.device, dtype=torch.int64)
        out["success"] = same_row(stored, index, out["target_index"]).to(errors.dtype)
        if pixels:
            low, high = value_range(stored) if stored_range is None else stored_range
            out["pixel_success"] = pixel_success(retrieved, targets, low, high)
    if support is not None:
        out["support"] = support.to(torch.int64)
    if steps is not None:
        out["steps"] = steps.to(torch.int64)
    return out


def same_row(stored: Tensor | MemoryBank, first: Tensor, second: Tensor) -> Tensor:
    """(Q,) bool: whether stored rows `first` and `second` (Q,) are the same row or equal rows."""
    bank = as_bank(stored)
    differ = first != second  # (Q,)
    if not bool(differ.any()):
        return ~differ
    _, a = bank.gather(first[differ].to(bank.device))  # (n, d_v)
    _, b = bank.gather(second[differ].to(bank.device))  # (n, d_v)
    same = ~differ
    same[differ] = torch.eq(a, b).all(dim=1).to(same.device)
    return same


def summarize(values: Tensor) -> dict[str, float]:
    """mean, std (population: divides by Q, so one query has std 0; identical values exactly 0)
    and median (the average of the two middle values for an even count) of a (Q,) tensor."""
    x = values.detach().to("cpu", torch.float64).flatten()
    if x.numel() == 0:
        return {"mean": math.nan, "std": math.nan, "median": math.nan}
    ordered = x.sort().values
    half = (x.numel() - 1) / 2
    median = (ordered[math.floor(half)] + ordered[math.ceil(half)]) / 2
    # Identical values have a std of exactly 0, not the rounding residue (~1e-17) of x - mean.
    std = 0.0 if bool(ordered[0] == ordered[-1]) else float(x.std(correction=0))
    return {"mean": float(x.mean()), "std": std, "median": float(median)}
