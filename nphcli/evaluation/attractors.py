"""What iterated retrieval converged to: the kind of fixed point each query reached, in the
taxonomy of Ramsauer et al. (2021, §3), whatever the model (docs/retrieving.md):

    w      = softmax(β · X · y)                 over all M stored patterns (the model's β)
    s      = min { k : sum of the k largest w_μ ≥ MASS }             (MASS = 0.9, Ramsauer et al.)
    kind   = "pattern"     if s = 1, or cos(y, ξ_nearest) ≥ 1 − PATTERN_EPSILON
             "global"      else if s ≥ GLOBAL_SHARE · M                 (GLOBAL_SHARE = 1/2)
             "metastable"  else, a metastable state of size s

PATTERN_EPSILON and GLOBAL_SHARE are nph's choices (the paper states no numbers for them).
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli.memory.bank import MemoryBank

ATTRACTOR_KINDS = ("pattern", "metastable", "global")  # the codes 0, 1, 2 of `kind`
MASS = 0.9
PATTERN_EPSILON = 1e-3
GLOBAL_SHARE = 0.5
MASS_ROUNDING = 1e-9  # sums within this of MASS count as reaching it (0.1 · 9 = 0.8999…)
BLOCK_ELEMENTS = 1 << 22  # (queries × M) weights held at once


def mass_size(weights: Tensor, mass: float = MASS) -> Tensor:
    """(Q,) int64: the fewest of each row's largest weights (Q, M) whose sum reaches `mass`."""
    ordered = torch.sort(weights, dim=1, descending=True).values  # (Q, M)
    goal = (mass - MASS_ROUNDING) * ordered.sum(dim=1, keepdim=True)  # (Q, 1), to rounding
    below = (ordered.cumsum(dim=1) < goal).sum(dim=1)
    return (below + 1).clamp(max=weights.shape[1])


def classify(
    final: Tensor,
    bank: MemoryBank,
    beta: float,
    nearest_cosine: Tensor,
    *,
    block_rows: int = 1 << 16,
    block_elements: int = BLOCK_ELEMENTS,
) -> dict[str, Tensor]:
    """Per query (Q,): `attractor` (an index into ATTRACTOR_KINDS) and `attractor_size` s for
    final states (Q, d) over the bank's keys, given each state's cosine to its nearest stored
    pattern (Q,). Scores are float64; the keys are read in blocks of `block_rows` (all ranks'
    rows), for as many queries at once as keep (queries × M) scores within `block_elements`."""
    dtype = torch.float64
    num_queries, num_memories = final.shape[0], bank.num_memories
    size = torch.empty(num_queries, dtype=torch.int64, device=final.device)
    rows = max(1, block_elements // max(1, num_memories))
    for q0 in range(0, num_queries, rows):
        y = final[q0 : q0 + rows].to(dtype)  # (B, d)
        parts = [
            y @ keys.to(device=y.device, dtype=dtype).T for _, keys in bank.key_blocks(block_rows)
        ]
        scores = torch.cat(parts, dim=1)  # (B, M_local)
        if bank.collective.world_size > 1:
            scores = bank.collective.all_cat(scores, dim=1)  # (B, M) in row order
        size[q0 : q0 + rows] = mass_size(torch.softmax(beta * scores, dim=1))
    kind = torch.full_like(size, 1)
    kind[size >= GLOBAL_SHARE * num_memories] = 2
    kind[(size == 1) | (nearest_cosine.to(size.device) >= 1 - PATTERN_EPSILON)] = 0
    return {"attractor": kind, "attractor_size": size}


def diagnose(
    model, final: Tensor, bank: MemoryBank, nearest_index: Tensor, positions: Tensor, **blocks: int
) -> dict[str, Tensor]:
    """The attractor diagnostics of an iterated run (`steps` > 1, auto-associative), per query
    (Q,): `attractor`, `attractor_size`, the shares `at_pattern`, `at_metastable`, `at_global`,
    and `energy`, the model's E(y) at the final state where it has one and the memory is whole
    in this process. {} for one-step or hetero-associative runs, and for a memory split across
    processes (not diagnosed there yet). `blocks`: `classify`'s block sizes."""
    if int(getattr(model, "steps", 1)) <= 1 or bank.hetero:
        return {}
    if bank.collective.world_size > 1:  # ranks would each weigh only their own rows
        return {}
    from nphcli.evaluation.metrics import cosine

    _, nearest_rows = bank.gather(nearest_index.to(bank.device))  # (Q, d)
    near_cos = cosine(final, nearest_rows.to(final.device))  # (Q,)
    out = classify(final, bank, float(getattr(model, "beta", 1.0)), near_cos, **blocks)
    for code, name in enumerate(ATTRACTOR_KINDS):  # (Q,) indicators: their means are shares
        out[f"at_{name}"] = (out["attractor"] == code).to(torch.float64)
    resident = bank.resident()
    if resident is not None and hasattr(model, "energy"):  # (one process: see above)
        energy = model.energy(final, resident[0], positions)
        if energy is not None:
            out["energy"] = energy.to(final.device)
    return out
