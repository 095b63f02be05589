"""The α-entmax threshold of rows of scores: exact, from a sampled start.

With z shifted to row max 0 and k = 1/(α−1), p_i ∝ [z_i − t]_+^k where the level t = τ/(α−1)
solves Σ_i [z_i − t]_+^k = (α−1)^{−k}; scores at or below t weigh exactly 0.

- α = 1.5 and 2: an active-set iteration (`_active_set`), no exp, log or pow.
- other α down to 1 + 1/`POWER_MAX`: Newton in units of z (`_power_newton`); closer to 1, the
  λ form of `functional.entmax_threshold`, exact to rounding as α → 1.
- the start: t solved on a strided sample of each row (`_starts`), for mass `SAFETY` > 1, lies
  a little below t; the sample's own threshold is a bound that cannot fail.

`entmax_block.py` retrieves with these; `triton_entmax.py` is the α = 1.5, 2 GPU kernel.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from nphcli.engine.functional import entmax_threshold, entmax_weights_and_u

SAMPLE, SAMPLE_MIN, SAMPLE_SHARE = 1024, 64, 64  # the start's sample: M/64 scores, 64 to 1024
SAFETY = 2.0  # the start asks the whole row for this much mass (> 1: below the threshold)
ACTIVE_SET_STEPS = 60  # bound on the active-set iterations; they take 2–4 from the sampled start
# The largest k solved in units of z: d = z − t carries a rounding of |t| ≈ k, which the power
# makes a relative error of about k²·ulp (k = 16: 1.5e-5 in float32).
POWER_MAX = 16


def _sample_stride(num_memories: int) -> int:
    """Every this-many-th score goes in a row's sample (measured on MNIST, Q = 1000)."""
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
    """α-entmax of the shifted scores z (Q, n) with weights summing to `mass`: the unnormalised
    weights (Q, n) (into `out`, which may be z), their sums, counts of weights > 0 and the
    level t (Q, 1) each. `start` (Q, 1): a first trial. `weight` (Q, n): each score's count."""
    eps = alpha - 1
    if closed_form(alpha):
        power, target = active_set_target(alpha, mass)
        return _active_set(z, power, target, start, weight, out)
    if power_form(alpha):
        power = _power_of(alpha)
        return _power_newton(z, power, mass * power**power, start, weight, out)
    # Levels in units of z lose their digits as ε → 0: converted to and from λ in float64, they
    # serve only as starts. λ ≥ −log m (the top alone weighs m): further left e^{−λ} overflows.
    lam = None
    if start is not None:
        lam = (-torch.log(-eps * start.double()) / eps).clamp(min=-math.log(mass)).to(z.dtype)
    scaled = z * eps  # (Q, n)
    lam = entmax_threshold(scaled, eps, start=lam, log_target=math.log(mass))  # (Q, 1)
    weights = entmax_weights_and_u(scaled, lam, eps)[0]  # (Q, n)
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
    """Whether α's threshold is solved by `_power_newton`."""
    return not closed_form(alpha) and (alpha - 1) * POWER_MAX >= 1


def _power_of(alpha: float) -> float:
    """k = 1/(α−1), rounded when within 1e-9 of an integer (α = 1.1 gives 9.999999999999991),
    which `_raise` takes by multiplications alone."""
    power = 1 / (alpha - 1)
    return float(round(power)) if abs(power - round(power)) <= 1e-9 * power else power


def active_set_target(alpha: float, mass: float = 1.0) -> tuple[int, float]:
    """For α = 1.5 or 2: k = 1/(α−1) and what Σ[z − t]_+^k must equal for weights of `mass`."""
    power = round(1 / (alpha - 1))
    return power, mass * (alpha - 1) ** -power


def active_set_bounds(power: float, mass: float, dtype: torch.dtype) -> tuple[float, float]:
    """The lowest level (the top alone carries `mass`) and the tolerance on a step."""
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
    """Σ_i w_i·[z_i − t]_+^power = mass solved for t: at a trial, the c memories above it give
    Σd and Σd², and the level where they alone carry the mass is a root of a quadratic
    (power 2) or linear (power 1) equation, off by the cube of the trial's error; a bracket
    catches stray steps. Returns [z − t]_+^power (Q, n) (in `out`), sums, counts and t."""
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
    """Σ_i w_i·[z_i − t]_+^k = mass (k = power > 1) solved for t; returns as `_active_set`.

    A pass takes one power d^{k−J} (d = [z − t]_+) and the moments F_j = Σ w·d^{k−j}, j ≤ J ≤ 3;
    the step solves their binomial series F(t + δ) = mass (`_series_step`), starting from the
    Newton step of the row's k-norm, convex and decreasing in t, so it stays left of the root.
    From the sampled start a second pass usually finds a step below rounding; rows at their
    level drop out."""
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
    """Write the rows `done` (L,) (None: all) of the rows `live` (None: all Q) into the results;
    returns the weights' result (made (Q, n) when None and rows finish apart)."""
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


# Where `_raise` takes a fractional power through log2 and exp2 (pow is slow there).
LOG_POWER_DEVICES = ("cpu",)


def _raise(d: Tensor, exponent: float, out: Tensor, spare: Tensor) -> Tensor:
    """d^exponent (Q, n), d ≥ 0, into `out`: by squaring for a whole exponent, else on the CPU
    sign(d)·2^(exponent·log2 max(d, tiny)) (2.4 ns a score against pow's 5.7–7), else pow."""
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
    """δ (Q, 1) with Σ_j C(k, j)·(−δ)^j·F_j = mass from F_0 … F_J (Q, 1), by Newton on the
    series' k-th root from the k-norm's own step (kept where the series goes astray). In numpy
    on the host: as tensors the dozens of tiny operations cost more than a pass over a row."""
    f = torch.cat(moments, dim=1).to("cpu", torch.float64).numpy()  # (Q, J + 1)
    total, slope = f[:, 0], f[:, 1]  # (Q,) each
    with np.errstate(all="ignore"):
        step = (1 - (mass / total) ** (1 / power)) * total / slope  # F′ = −k·F_1
        if f.shape[1] > 2:
            step = _series_root(f, power, mass, step)
    return torch.from_numpy(step[:, None]).to(moments[0].device, moments[0].dtype)


def _series_root(f: np.ndarray, power: float, mass: float, step: np.ndarray) -> np.ndarray:
    """`_series_step`'s Newton iterations from the first-order step (Q,)."""
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
    """From a strided sample of z's columns: the threshold's estimate, a start a little below
    it and a bound never above it (Q, 1) each; the sample's share above the start, and the
    largest share of a row's sample above the estimate (the widest support, roughly)."""
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
    """The level (Q, 1) where whole rows would carry `mass`, from their sample (Q, n)."""
    if closed_form(alpha) or power_form(alpha):
        # Each sampled score stands for M/n, the row's top only for itself (weight 1).
        weight = torch.where(sample == 0, 0.0, num_memories / sample.shape[1])  # (Q, n)
        weight = torch.cat([weight, weight.new_ones(len(sample), 1)], dim=1).to(sample.dtype)
        rows = torch.cat([sample, sample.new_zeros(len(sample), 1)], dim=1)  # (Q, n + 1)
        return solve(rows, alpha, start=start, mass=mass, weight=weight)[3]
    share = mass * sample.shape[1] / num_memories  # the sample alone, for its share of the mass
    if share >= 1:  # the sample is the row: its own level
        return start
    return solve(sample - top, alpha, start=start - top, mass=share)[3] + top
