"""α-entmax weights of a block of scores, one Triton program per query.

The eager route's hundreds of small operations and host syncs per batch took 10–27× dense on a
GPU (H200, Q = 200, M = 60,000); here one launch does every row's whole solve, with the eager
iterations' steps, bracket and tolerance: `thresholds._sample_level`'s start, then
`thresholds._active_set` (α = 1.5, 2) or `functional.entmax_threshold`'s λ form (other α), then
the unnormalised weights written over the scores, with their sum and count.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from nphcli.engine import functional
from nphcli.engine.thresholds import (
    ACTIVE_SET_STEPS,
    active_set_bounds,
    active_set_target,
    closed_form,
)

BLOCK = tl.constexpr(1024)  # scores a program reads at a time
STEPS = tl.constexpr(ACTIVE_SET_STEPS)  # the bound on each solve's steps, the eager iteration's
NEWTON_STEPS = tl.constexpr(functional.NEWTON_STEPS)  # and on the Newton iteration's (other α)


@triton.jit
def _moments(base, trial, count, stride, weight, SAMPLED: tl.constexpr, POWER: tl.constexpr):
    """Σw·1[d > 0], Σw·d and Σw·d^POWER of d = [z − trial]_+ over z[0], z[stride], … (`count`
    scores); w = `weight`, except a sampled top (z = 0, weight 0: the top counts for itself)."""
    zero = tl.zeros([BLOCK], dtype=base.dtype.element_ty)
    ones, firsts, seconds = zero, zero, zero
    for first in range(0, count, BLOCK):
        offsets = first + tl.arange(0, BLOCK)
        z = tl.load(base + offsets.to(tl.int64) * stride, mask=offsets < count, other=-float("inf"))
        d = tl.maximum(z - trial, 0.0)
        if SAMPLED:
            w = tl.where(z == 0.0, 0.0, weight)
            d_weighed = w * d
            ones += tl.where(d > 0.0, w, 0.0)
        else:
            d_weighed = d
            ones += tl.where(d > 0.0, 1.0, 0.0)
        firsts += d_weighed
        if POWER == 2:
            seconds += d_weighed * d
    total = firsts
    if POWER == 2:
        total = seconds
    return tl.sum(ones), tl.sum(firsts), tl.sum(total)


@triton.jit
def _solve(
    base,
    count,
    stride,
    weight,
    start,
    lowest,
    mass,
    tolerance,
    SAMPLED: tl.constexpr,
    POWER: tl.constexpr,
):
    """The level t with Σw·[z − t]_+^POWER (+ the top's own term when SAMPLED) = mass, from
    `start`, in the bracket [lowest, 0]: (the last trial, its sum and its count)."""
    low, high = lowest, lowest * 0.0
    t = tl.minimum(tl.maximum(start, low), high)
    trial, total, ones, error = t, t * 0.0, t * 0.0, tolerance * 2.0
    steps = 0
    while (steps < STEPS) & (error > tolerance):
        trial = t
        ones, firsts, total = _moments(base, trial, count, stride, weight, SAMPLED, POWER)
        if SAMPLED:  # the row's top, 0, for itself: d = −trial ≥ 0
            ones += tl.where(trial < 0.0, 1.0, 0.0)
            firsts += -trial
            if POWER == 2:
                total += trial * trial
            else:
                total += -trial
        excess = total - mass
        if POWER == 2:
            # c·a² − 2·Σd·a + Σd² − mass = 0: its smaller root without cancellation; with no
            # real root (a trial far below the level) a Newton step, which stays below it.
            disc = firsts * firsts - ones * excess
            root = excess / (firsts + tl.sqrt(tl.maximum(disc, 0.0)))
            step = tl.where(disc >= 0.0, root, excess / (2.0 * firsts))
        else:
            step = excess / ones
        error = tl.abs(step)
        below = total >= mass
        low = tl.where(below, tl.maximum(low, t), low)
        high = tl.where(below, high, tl.minimum(high, t))
        t = t + step
        stray = ((t < low) | (t > high)) & (error > tolerance)
        t = tl.where(stray, (low + high) / 2.0, t)
        steps += 1
    return trial, total, ones


@triton.jit
def _weigh_kernel(
    z_ptr,
    row_stride,
    width,
    sample_stride,
    lowest,
    mass,
    tolerance,
    sums_ptr,
    counts_ptr,
    POWER: tl.constexpr,
):
    """Row `program_id` of the shifted scores z (row max 0) → [z − t]_+^POWER in place, the
    weights' sum and count; t solved from a sampled start."""
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * row_stride
    dtype = z_ptr.dtype.element_ty
    zero = tl.full([], 0.0, dtype)  # scalars as the scores' type (they arrive as float32)
    lowest, mass, tolerance = zero + lowest, zero + mass, zero + tolerance
    sampled = tl.cdiv(width, sample_stride)
    weight = (width / sampled).to(dtype)
    start, _, _ = _solve(
        base, sampled, sample_stride, weight, lowest, lowest, mass, tolerance, True, POWER
    )
    level, total, ones = _solve(
        base, width, 1, weight, start, lowest, mass, tolerance, False, POWER
    )
    for first in range(0, width, BLOCK):
        offsets = first + tl.arange(0, BLOCK)
        inside = offsets < width
        d = tl.maximum(tl.load(base + offsets, mask=inside, other=0.0) - level, 0.0)
        if POWER == 2:
            d = d * d
        tl.store(base + offsets, d, mask=inside)
    tl.store(sums_ptr + row, total)
    tl.store(counts_ptr + row, ones)


@triton.jit
def _log1p(u):
    """log(1 + u) for u ≥ −1 (−inf at −1), to rounding however small u is: the error of
    forming 1 + u cancels in log(w)·u / (w − 1) (Goldberg's trick)."""
    w = 1.0 + u
    exact, positive = w == 1.0, w > 0.0
    ratio = u / tl.where(exact | ~positive, 1.0, w - 1.0)
    log_w = tl.log(tl.where(positive, w, 1.0))
    return tl.where(exact, u, tl.where(positive, log_w * ratio, -float("inf")))


@triton.jit
def _expm1(x):
    """e^x − 1 to rounding for small x, by the same trick (w = e^x, (w − 1)·x / log w)."""
    w = tl.exp(x)
    plain = (w == 1.0) | (w == 0.0)
    ratio = x / tl.log(tl.where(plain, 2.0, w))
    return tl.where(w == 1.0, x, tl.where(w == 0.0, -1.0, (w - 1.0) * ratio))


@triton.jit
def _newton_weights(base, width, lam, eps, WRITE: tl.constexpr):
    """Σp and S = Σp/(1 + u) at λ, p_i = exp(log1p(u_i)/ε − λ), u_i = max(ε·z_i·e^{ελ}, −1)
    (`functional.entmax_weights_and_u`), and the count of p > 0; with WRITE, p over the scores."""
    zero = tl.zeros([BLOCK], dtype=base.dtype.element_ty)
    masses, slopes, ones = zero, zero, zero
    scale = tl.exp(eps * lam)
    for first in range(0, width, BLOCK):
        offsets = first + tl.arange(0, BLOCK)
        inside = offsets < width
        z = tl.load(base + offsets, mask=inside, other=-float("inf"))
        u = tl.maximum(eps * z * scale, -1.0)
        kept = u > -1.0
        p = tl.where(kept, tl.exp(_log1p(u) / eps - lam), 0.0)
        masses += p
        slopes += p / tl.where(kept, 1.0 + u, 1.0)
        ones += tl.where(p > 0.0, 1.0, 0.0)
        if WRITE:
            tl.store(base + offsets, p, mask=inside)
    return tl.sum(masses), tl.sum(slopes), tl.sum(ones)


@triton.jit
def _newton_kernel(z_ptr, row_stride, width, eps, tolerance, sums_ptr, counts_ptr):
    """Row `program_id` of z → its unnormalised α-entmax weights in place, their sum and count:
    λ by `functional.entmax_threshold`'s Newton iteration from λ = 0 (left of the root)."""
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * row_stride
    zero = tl.full([], 0.0, z_ptr.dtype.element_ty)  # scalars as the scores' type
    eps, tolerance = zero + eps, zero + tolerance
    lam, step = zero, zero + 1.0
    steps = 0
    while (steps < NEWTON_STEPS) & (tl.abs(step) > tolerance * (1.0 + tl.abs(lam))):
        mass, slope, _ = _newton_weights(base, width, lam, eps, False)
        ratio = -mass * _expm1(-eps * tl.log(mass)) / slope
        step = -_log1p(-ratio) / eps
        lam = lam + step
        steps += 1
    mass, _, ones = _newton_weights(base, width, lam, eps, True)
    tl.store(sums_ptr + row, mass)
    tl.store(counts_ptr + row, ones)


def weigh_rows(z: Tensor, alpha: float, sample_stride: int) -> tuple[Tensor, Tensor]:
    """Overwrite the shifted scores z (Q, M) (float32 or float64, row max 0, rows contiguous)
    with unnormalised α-entmax weights (1 < α ≤ 2): for α = 1.5 and 2 [z − t]_+^power, summing
    to (α − 1)^−power, from a start sampled every `sample_stride` scores; for other α the λ
    form, summing to 1. Return the sums and counts (Q, 1) each, as
    `entmax_block._weigh_in_place` does."""
    rows, width = z.shape
    sums = torch.empty(rows, 1, dtype=z.dtype, device=z.device)
    counts = torch.empty(rows, 1, dtype=z.dtype, device=z.device)
    if closed_form(alpha):
        power, mass = active_set_target(alpha)
        lowest, tolerance = active_set_bounds(power, mass, z.dtype)
        _weigh_kernel[(rows,)](
            z, z.stride(0), width, sample_stride, lowest, mass, tolerance, sums, counts,
            POWER=power,
        )  # fmt: skip
    else:
        tolerance = functional.newton_tolerance(z.dtype)
        _newton_kernel[(rows,)](z, z.stride(0), width, alpha - 1, tolerance, sums, counts)
    return sums, counts
