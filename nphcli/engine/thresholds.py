"""The α-entmax threshold of rows of scores: exact, from a sampled start.

α-entmax gives p_i = [(α−1)·z_i − τ]_+^{1/(α−1)} on scores z shifted to row max 0. Here the
threshold is kept in units of z, t = τ/(α−1): p_i ∝ [z_i − t]_+^k, k = 1/(α−1), and t is the
level at which Σ_i [z_i − t]_+^k = (α−1)^{−k}. Every score at or below t weighs exactly 0.

- For α = 1.5 (k = 2) and α = 2 (k = 1, sparsemax) t is solved by an active-set iteration with
  no exp, log or pow: at a trial t, the memories above it give c, Σd and Σd² (d = z − t), and
  the level where those c memories alone carry the mass is a root of a quadratic (k = 2) or
  linear (k = 1) equation. Wrong memories in the set (a trial below t) or missing ones (above)
  change that root only by the cube of the trial's error, so from a sampled start two or three
  passes pin t to rounding; a bracket of trials known to lie below and above t catches any
  stray step.
- For other α down to 1 + 1/`POWER_MAX`, Newton's method in units of z (`_power_newton`): one
  fractional power per score and pass (`_raise`: none for a whole k, products), the moments
  Σd^{k−j} for j ≤ 3, and the step from their binomial series; two passes from the sampled
  start for most rows, and rows at their level drop out of later passes. Closer to 1 the
  monotone Newton iteration of `functional.entmax_threshold` in its λ form, exact to rounding
  as α → 1.
- The start: t solved on a strided sample of n scores per row, each standing for M/n of them
  (the row's top only for itself), for weights summing to `SAFETY` > 1 lies a little below the
  threshold (more mass needs a lower level); the sample's own threshold (a subset's is never
  above the whole's) is a bound that cannot fail.

`entmax_block.py` retrieves with these from one block of all M scores; `triton_entmax.py` runs
the same iteration for α = 1.5 and 2 in one GPU kernel.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from nphcli.engine.functional import entmax_threshold, entmax_unnormalised

SAMPLE, SAMPLE_MIN, SAMPLE_SHARE = 1024, 64, 64  # the start's sample: M/64 scores, 64 to 1024
SAFETY = 2.0  # the start asks the whole row for this much mass (> 1: below the threshold)
ACTIVE_SET_STEPS = 60  # bound on the active-set iterations; they take 2–4 from the sampled start
# The largest power k = 1/(α−1) solved in units of z (`_power_newton`): there d = z − t carries
# an absolute rounding of |t| ≈ k, which raising to the power k makes a relative error of about
# k²·ulp in a weight (k = 16: 1.5e-5 in float32). Above it (α < 1.0625) the λ form, exact to
# rounding as α → 1.
POWER_MAX = 16


def _sample_stride(num_memories: int) -> int:
    """Every this-many-th score goes in a row's sample (all below M = 128). Q = 1000, 1 thread: at
    M = 5,000 (MNIST) 1,024 scores made entmax 1.45× dense, 78 0.89×; at 60,000 256–1,024 tied."""
    return max(1, num_memories // min(SAMPLE, max(SAMPLE_MIN, num_memories // SAMPLE_SHARE)))


def solve(
    z: Tensor,
    alpha: float,
    *,
    start: Tensor | None = None,
    mass: float = 1.0,
    weight: Tensor | None = None,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """α-entmax of the shifted scores z (Q, n) (row max 0, −inf entries weigh nothing) with
    weights summing to `mass`: the unnormalised weights (Q, n) (written to `out` when given,
    which may be z itself), their sums, counts of weights > 0 and the level t in units of z
    (Q, 1) each. `start` (Q, 1) is a first trial level. `weight` (Q, n), for α = 1.5 and 2
    only, counts each score that many times (a sample standing for a whole row)."""
    eps = alpha - 1
    if closed_form(alpha):
        power, target = active_set_target(alpha, mass)
        return _active_set(z, power, target, start, weight, out)
    if power_form(alpha):
        power = _power_of(alpha)
        return _power_newton(z, power, mass * power**power, start, weight, out)
    # Levels in units of z lose ε·|t| ≈ 1 of their digits as ε → 0: they are converted to and
    # from λ (τ = −e^{−ελ}) in float64, and serve only as starts and checks.
    # A start left of λ = −log m (the top entry alone weighs m, a valid start too) only adds
    # steps, and near α = 1 its weights e^{−λ} overflow (λ ≈ −132 at α = 1.0001): take the
    # larger of the two, still left of the root.
    lam = None
    if start is not None:
        lam = (-torch.log(-eps * start.double()) / eps).clamp(min=-math.log(mass)).to(z.dtype)
    scaled = z * eps  # (Q, n)
    lam = entmax_threshold(scaled, eps, start=lam, log_target=math.log(mass))  # (Q, 1)
    weights = entmax_unnormalised(scaled, lam, eps)  # (Q, n)
    count = (weights > 0).sum(dim=1, keepdim=True)  # (Q, 1)
    t = -torch.exp(-eps * lam.double()) / eps  # (Q, 1) float64
    if out is not None:
        weights = out.copy_(weights)
    return weights, weights.sum(dim=1, keepdim=True), count, t


def closed_form(alpha: float) -> bool:
    """Whether α's threshold is solved by the active-set iteration: α = 1.5 or 2."""
    power = round(1 / (alpha - 1))
    return power in (1, 2) and power * (alpha - 1) == 1


def power_form(alpha: float) -> bool:
    """Whether α's threshold is solved in units of z by `_power_newton`: 1 + 1/`POWER_MAX` ≤ α
    (α = 1.5 and 2 have the active-set iteration instead)."""
    return not closed_form(alpha) and (alpha - 1) * POWER_MAX >= 1


def _power_of(alpha: float) -> float:
    """k = 1/(α−1), rounded to the nearest integer when within 1e-9 of it: α = 1.1 or 1.25, as
    written, are 1/10 and 1/4 off by a rounding of α − 1 (k = 9.999999999999991), and an integer
    k raises to its power by multiplications alone (`_raise`)."""
    power = 1 / (alpha - 1)
    return float(round(power)) if abs(power - round(power)) <= 1e-9 * power else power


def active_set_target(alpha: float, mass: float = 1.0) -> tuple[int, float]:
    """For α = 1.5 or 2: the power k = 1/(α−1) and what Σ[z − t]_+^k must equal for α-entmax
    weights summing to `mass` (they are (α−1)^k·[z − t]_+^k)."""
    power = round(1 / (alpha - 1))
    return power, mass * (alpha - 1) ** -power


def active_set_bounds(power: float, mass: float, dtype: torch.dtype) -> tuple[float, float]:
    """The active-set iteration's lowest level, where the top (0) alone carries `mass`, and its
    tolerance on a step, for scores of `dtype`."""
    lowest = mass ** (1 / power)
    return -lowest, 8 * torch.finfo(dtype).eps * lowest


def _active_set(
    z: Tensor,
    power: int,
    mass: float,
    start: Tensor | None,
    weight: Tensor | None,
    out: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Σ_i w_i·[z_i − t]_+^power = mass (w = `weight`, else 1) solved for t by the active-set
    iteration (module docstring): [z − t]_+^power (Q, n) at the final t (in `out` if given),
    its row sums, counts and t (Q, 1) each. Each evaluation is one subtraction, one clamp and
    three row reductions over z, so a chunk of z that fits the cache stays there."""
    rows = z.shape[0]
    lowest, tolerance = active_set_bounds(power, mass, z.dtype)
    lo = z.new_full((rows, 1), lowest)  # the top alone carries `mass` here
    hi = z.new_zeros(rows, 1)  # nothing weighs at the top's level
    t = lo if start is None else torch.minimum(torch.maximum(start, lo), hi)  # (Q, 1)
    weights, spare = torch.empty_like(z), torch.empty_like(z)  # (Q, n) scratch
    for _ in range(ACTIVE_SET_STEPS):
        trial = t
        d = torch.sub(z, trial, out=weights).clamp_(min=0)  # (Q, n)
        count, s1, total = _moments(d, power, weight, spare)  # (Q, 1) each
        if power == 2:
            # c·a² − 2·Σd·a + Σd² − mass = 0: its smaller root, written without cancellation;
            # with no real root (a trial far below t) a Newton step, which stays below t.
            disc = s1 * s1 - count * (total - mass)  # (Q, 1)
            root = (total - mass) / (s1 + disc.clamp(min=0).sqrt())
            step = torch.where(disc >= 0, root, (total - mass) / (2 * s1))  # (Q, 1)
        else:
            step = (total - mass) / count  # (Q, 1)
        if not bool(step.abs().amax() > tolerance):
            break
        below = total >= mass  # (Q, 1) the trial lies at or below t
        lo = torch.where(below, torch.maximum(lo, t), lo)
        hi = torch.where(below, hi, torch.minimum(hi, t))
        t = t + step
        stray = ((t < lo) | (t > hi)) & (step.abs() > tolerance)  # (Q, 1) left the bracket
        t = torch.where(stray, (lo + hi) / 2, t)
    if out is None:
        out = d
    if power == 2:
        torch.mul(d, d, out=out)
    elif out is not d:
        out.copy_(d)
    return out, total, count, trial


def _power_newton(
    z: Tensor,
    power: float,
    mass: float,
    start: Tensor | None,
    weight: Tensor | None,
    out: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Σ_i w_i·[z_i − t]_+^k = mass (w = `weight`, else 1; k = power > 1) solved for t:
    [z − t]_+^k (Q, n) at the last trial (in `out` if given), its row sums, counts of weights
    > 0 and the trial (Q, 1) each.

    Each pass over z at a trial t takes one power, d^{k−J} (d = [z − t]_+), and multiplies up to
    the moments F_j = Σ w·d^{k−j}, j = J … 0 (J ≤ 3, k − J > 0). The step δ then solves, on
    (Q, 1) numbers alone, the binomial series F(t + δ) ≈ Σ_j C(k, j)·(−δ)^j·F_j = mass, by
    Newton's method on its k-th root, from the Newton step of the whole row's k-norm,
    g(t) = (F(t)/mass)^{1/k} − 1. That norm is convex and decreasing in t (a norm of functions
    convex in t), so its own step from the left of the root stays left; the series adds the
    curvature (scores that leave the support weigh O(δ^k) and are left out), so from the
    sampled start a second pass finds a step below rounding, with no exp or log1p: two pows per
    row in all, where `functional.entmax_threshold`'s λ form takes three to four passes of
    log1p and exp. A bracket of trials below and above t catches any stray step."""
    lowest, tolerance = active_set_bounds(power, mass, z.dtype)  # the top alone carries `mass`
    rows = z.shape[0]
    lo = z.new_full((rows, 1), lowest)  # (L, 1) for the rows still solving
    hi = torch.zeros_like(lo)  # (L, 1) nothing weighs at the top's level
    t = lo if start is None else torch.where(start < 0, torch.maximum(start.to(z.dtype), lo), lo)
    terms = min(3, math.ceil(power) - 1)  # J
    shifted, weights = torch.empty_like(z), torch.empty_like(z)  # (Q, n) scratch
    logs = z.device.type in LOG_POWER_DEVICES and not (power - terms).is_integer()
    spare = torch.empty_like(z) if logs else weights  # (Q, n) `_raise`'s scratch, if it needs one
    result = out  # (Q, n), made when rows finish apart and no `out` is given
    totals, trials = torch.empty_like(lo), torch.empty_like(lo)  # (Q, 1) each
    live, part, part_weight = None, z, weight  # rows still solving (None: all), their z and w
    for attempt in range(ACTIVE_SET_STEPS):
        size = part.shape[0]
        d = torch.sub(part, t, out=shifted[:size]).clamp_(min=0)  # (L, n); the top's −t > 0
        moment = _raise(d, power - terms, weights[:size], spare[:size])  # (L, n) d^{k−J}
        if part_weight is not None:
            moment.mul_(part_weight)
        moments = [moment.sum(dim=1, keepdim=True)]  # (L, 1) each, F_J first
        for _ in range(terms):
            moments.append(moment.mul_(d).sum(dim=1, keepdim=True))
        total = moments[-1]  # (L, 1) F = F_0; `moment` now holds w·d^k
        step = _series_step(moments[::-1], power, mass)  # (L, 1)
        done = (step.abs() <= tolerance).squeeze(1)  # (L,)
        if attempt == ACTIVE_SET_STEPS - 1 or bool(done.all()):
            result = _keep(result, totals, trials, live, None, moment, total, t)
            break
        if bool(done.any()):  # rows at their level keep their weights; the rest go on alone
            result = _keep(result, totals, trials, live, done, moment, total, t)
            rest = (~done).nonzero().squeeze(1)  # (L',)
            live = rest if live is None else live[rest]
            t, step, total, lo, hi = t[rest], step[rest], total[rest], lo[rest], hi[rest]
            part = z[live]  # (L', n)
            part_weight = None if weight is None else weight[live]
        below = total >= mass  # (L, 1) the trial lies at or below t
        lo = torch.where(below, torch.maximum(lo, t), lo)
        hi = torch.where(below, hi, torch.minimum(hi, t))
        t = t + step
        stray = ((t < lo) | (t > hi)) & (step.abs() > tolerance)  # (L, 1) left the bracket
        t = torch.where(stray, (lo + hi) / 2, t)
    count = torch.sign(result, out=shifted).sum(dim=1, keepdim=True)  # (Q, 1)
    return result, totals, count, trials


def _keep(result, totals, trials, live, done, weights, total, t) -> Tensor:
    """Write the solved rows' weights (L, n), sums and levels (L, 1) into the results (Q, ·),
    made (Q, n) when None unless all rows finish at once: the rows `done` (L,) marks (None:
    all L), of the rows `live` (L,) names (None: all Q). Returns the weights' result."""
    if done is not None:
        weights, total, t = weights[done], total[done], t[done]
        live = done.nonzero().squeeze(1) if live is None else live[done]
    if live is None:
        totals.copy_(total)
        trials.copy_(t)
        return weights if result is None else result.copy_(weights)
    if result is None:
        result = weights.new_empty((len(totals), weights.shape[1]))  # (Q, n)
    result[live], totals[live], trials[live] = weights, total, t
    return result


# Devices where `_raise` takes a fractional power through log2 and exp2 (CPUs, where pow is slow);
# elsewhere torch.pow, one pass where the log form takes six (a GPU's are memory-bound).
LOG_POWER_DEVICES = ("cpu",)


def _raise(d: Tensor, exponent: float, out: Tensor, spare: Tensor) -> Tensor:
    """d^exponent (Q, n), d ≥ 0, into `out` (`spare`: scratch of its shape): by squaring and
    products for a whole exponent (each a tenth of a pow's time on the CPU); a fractional one on
    `LOG_POWER_DEVICES` as 2^(exponent·log2 d), each 0 raised as the smallest normal number and
    then multiplied by sign(d) = 0, else torch.pow. On the CPU (AVX2, one thread, float32)
    torch.pow took 5.7–7 ns a score, log2 and exp2 1.2 and 0.5 where no input is 0 (a 0's −inf
    takes a slow path: log2 6.6 ns), the six passes here about 2.4 ns in all; the result is
    within (4 + |exponent·log2 d|) ulps of d^exponent (the rounding of the product, which exp2
    carries), where pow's is within one."""
    if not exponent.is_integer():
        if d.device.type not in LOG_POWER_DEVICES:
            return torch.pow(d, exponent, out=out)
        torch.clamp(d, min=torch.finfo(d.dtype).tiny, out=out).log2_().mul_(exponent).exp2_()
        return out.mul_(torch.sign(d, out=spare))
    out.copy_(d)
    for bit in bin(int(exponent))[3:]:  # the exponent's bits after the leading one
        out.square_()
        if bit == "1":
            out.mul_(d)
    return out


SERIES_STEPS = 3  # Newton steps on the series (Q, 1); each gains its order of digits


def _series_step(moments: list[Tensor], power: float, mass: float) -> Tensor:
    """δ (Q, 1) with Σ_j C(k, j)·(−δ)^j·F_j = mass, from moments F_0 … F_J (Q, 1) each (k =
    power): Newton on the series' k-th root from the first-order step, which is Newton's on the
    k-norm itself and is kept where the series' steps go astray (a non-positive series or
    slope). With J = 1 that first step is the answer. The (Q, J + 1) numbers are solved in
    float64 on the host with numpy: as torch tensors each of the few dozen tiny operations cost
    more than a pass over a row of scores."""
    f = torch.cat(moments, dim=1).to("cpu", torch.float64).numpy()  # (Q, J + 1)
    total, slope = f[:, 0], f[:, 1]  # (Q,) each
    with np.errstate(all="ignore"):
        step = (1 - (mass / total) ** (1 / power)) * total / slope  # F′ = −k·F_1
        if f.shape[1] > 2:
            step = _series_root(f, power, mass, step)
    return torch.from_numpy(step[:, None]).to(moments[0].device, moments[0].dtype)


def _series_root(f: np.ndarray, power: float, mass: float, step: np.ndarray) -> np.ndarray:
    """`_series_step`'s Newton iterations on the series with moments f (Q, J + 1), from the
    first-order step (Q,)."""
    binomials = np.cumprod([1.0] + [-(power - j) / (j + 1) for j in range(f.shape[1] - 1)])
    terms = f * binomials  # (Q, J + 1) C(k, j)·(−1)^j·F_j
    slopes = terms[:, 1:] * np.arange(1, f.shape[1])  # (Q, J) the derivative's coefficients
    delta = step
    for _ in range(SERIES_STEPS):
        powers = delta[:, None] ** np.arange(f.shape[1])  # (Q, J + 1)
        value = (terms * powers).sum(axis=1)  # (Q,) F(t + δ)
        slope = (slopes * powers[:, :-1]).sum(axis=1)  # (Q,)
        update = power * value * (1 - (mass / np.maximum(value, 0)) ** (1 / power)) / slope
        delta = np.where((value > 0) & (slope < 0), delta - update, step)
    return np.where(np.isfinite(delta), delta, step)


def _moments(
    d: Tensor, power: int, weight: Tensor | None, spare: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Σw·1[d > 0], Σw·d and Σw·d^power over each row of d = [z − t]_+ (Q, n): (Q, 1) each."""
    if weight is not None:
        ones = torch.sign(d, out=spare).mul_(weight)  # (Q, n)
        count = ones.sum(dim=1, keepdim=True)
        wd = torch.mul(d, weight, out=spare)  # (Q, n)
        s1 = wd.sum(dim=1, keepdim=True)
        total = (wd * d).sum(dim=1, keepdim=True) if power == 2 else s1
        return count, s1, total
    count = torch.sign(d, out=spare).sum(dim=1, keepdim=True)  # ≥ 1: t < 0
    s1 = d.sum(dim=1, keepdim=True)
    if power == 1:
        return count, s1, s1
    return count, s1, torch.linalg.vector_norm(d, dim=1, keepdim=True).square_()


def _starts(z: Tensor, alpha: float) -> tuple[Tensor, Tensor, Tensor, float, float]:
    """From a strided sample of z's columns, in units of z (Q, 1) each: the threshold's
    estimate (either side of it), a start a little below it, a bound that cannot be above it;
    the share of the sample above the start, and the largest share of a row's sample above the
    estimate (the widest support, roughly)."""
    num_memories = z.shape[1]
    sample = z[:, :: _sample_stride(num_memories)].contiguous()  # (Q, n): one strided read
    top = sample.amax(dim=1, keepdim=True)  # (Q, 1)
    safe = solve(sample - top, alpha)[3] + top  # (Q, 1): a subset's level is never higher
    levels = [safe]
    for mass in (SAFETY, 1.0):  # more mass, lower level: the start lies below the estimate
        level = _sample_level(sample, top, num_memories, alpha, mass, start=levels[-1])
        levels.append(torch.maximum(level, levels[-1]))  # (Q, 1)
    _, start, guess = levels
    share = float((sample > start).sum()) / sample.numel()
    widest = float((sample > guess).sum(dim=1).amax()) / sample.shape[1]
    return guess, start, safe, share, widest


def _sample_level(
    sample: Tensor, top: Tensor, num_memories: int, alpha: float, mass: float, start: Tensor
) -> Tensor:
    """The level (Q, 1) at which the whole rows would carry `mass`, estimated from the sample
    (Q, n) of z (row max 0; the sample's own top (Q, 1)); `start` a level below it."""
    if closed_form(alpha) or power_form(alpha):
        # Each sampled score stands for M/n scores, except the row's top, which stands for
        # itself (counted M/n times, a top far above the rest pulls the estimate up): it is
        # appended with weight 1 and its sampled copies weigh 0.
        weight = torch.where(sample == 0, 0.0, num_memories / sample.shape[1])  # (Q, n)
        weight = torch.cat([weight, weight.new_ones(len(sample), 1)], dim=1).to(sample.dtype)
        rows = torch.cat([sample, sample.new_zeros(len(sample), 1)], dim=1)  # (Q, n + 1)
        return solve(rows, alpha, start=start, mass=mass, weight=weight)[3]
    share = mass * sample.shape[1] / num_memories  # the sample alone, for its share of the mass
    if share >= 1:  # the sample is the row: its own level
        return start
    return solve(sample - top, alpha, start=start - top, mass=share)[3] + top
