"""Maps from scores (Q, M) to weights (Q, M) on the simplex Δ = {p : p ≥ 0, Σ p = 1}, row by row.

All are shift-invariant, so they subtract the row maximum first: no exp overflows and no
threshold loses precision, from β = 1e-6 to 1e4. float32 or float64 (half inputs come upcast).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax restricted to `mask` (Q, M) bool: p_i = exp(s_i) / Σ_{j∈mask} exp(s_j) for i in
    the mask and exactly 0 outside it. Every row must keep at least one memory."""
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def sparsemax(scores: Tensor) -> Tensor:
    """Euclidean projection of each row onto the simplex: p = argmin_{p∈Δ} ‖p − s‖²
    (Martins & Astudillo 2016).

    Closed form p_i = [s_i − τ]_+ with the scores sorted as z_(1) ≥ … ≥ z_(M),
    k* = max{k : 1 + k·z_(k) > Σ_{j≤k} z_(j)} and τ = (Σ_{j≤k*} z_(j) − 1) / k*.
    Backward in closed form: ∂p/∂s = diag(1_S) − 1_S 1_Sᵀ / |S| on the support S.
    """
    if torch.is_grad_enabled() and scores.requires_grad:
        return _Sparsemax.apply(scores)
    # Exactly shift-invariant, so the max carries no gradient.
    z = scores - scores.amax(dim=-1, keepdim=True).detach()  # (Q, M), row max 0
    num_memories = z.shape[-1]
    sorted_z = torch.sort(z, dim=-1, descending=True).values  # (Q, M)
    cumsum = sorted_z.cumsum(dim=-1)  # (Q, M)
    ranks = torch.arange(1, num_memories + 1, device=z.device)  # (M,)
    in_support = 1 + ranks.to(z.dtype) * sorted_z > cumsum  # (Q, M), a prefix in exact arithmetic
    # The largest qualifying rank, not the count, so a rounding blip past the prefix cannot
    # shrink k*; rank 1 always qualifies (1 + 0 > 0), so k* ≥ 1.
    k_star = torch.where(in_support, ranks, 0).amax(dim=-1, keepdim=True)  # (Q, 1)
    tau = (cumsum.gather(-1, k_star - 1) - 1) / k_star.to(z.dtype)  # (Q, 1)
    return torch.clamp(z - tau, min=0)


class _Sparsemax(torch.autograd.Function):
    """vector-Jacobian product g ↦ 1_S ⊙ (g − Σ_S g / |S|), with no pass through the sort."""

    @staticmethod
    def forward(ctx, scores: Tensor) -> Tensor:
        p = sparsemax(scores)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> Tensor:
        (p,) = ctx.saved_tensors
        support = (p > 0).to(grad_output.dtype)  # (Q, M)
        shift = (grad_output * support).sum(dim=-1, keepdim=True) / support.sum(
            dim=-1, keepdim=True
        )  # (Q, 1)
        return support * (grad_output - shift)


def entmax_bisect(scores: Tensor, alpha: float) -> Tensor:
    """α-entmax of each row (Peters et al. 2019), for 1 ≤ α ≤ 2:
    p = argmax_{p∈Δ} pᵀs + H_α(p), with the Tsallis entropy H_α(p) = Σ_j (p_j − p_j^α) / (α(α−1)).

    p_i = [(α−1)·s_i − τ]_+^{1/(α−1)} with τ found by bisection to rounding: the slow, obvious
    reference of `entmax`. α = 1 is softmax, α = 2 sparsemax.
    """
    if alpha == 1:
        return torch.softmax(scores, dim=-1)
    return _Entmax.apply(scores, float(alpha), _bisect)


def entmax(scores: Tensor, alpha: float) -> Tensor:
    """`entmax_bisect` with τ from a Newton iteration (`entmax_threshold`): a handful of passes
    over the scores instead of one per mantissa bit. Same backward."""
    if alpha == 1:
        return torch.softmax(scores, dim=-1)
    return _Entmax.apply(scores, float(alpha), _newton)


NEWTON_STEPS = 100  # a bound, not a budget: 1 (softmax) to about 10 steps over all α and β


def newton_tolerance(dtype: torch.dtype) -> float:
    """`entmax_threshold` stops when a step moves λ by less than this times 1 + |λ|."""
    return 4 * torch.finfo(dtype).eps


def entmax_threshold(
    scaled: Tensor, eps: float, *, start: Tensor | None = None, log_target: float | Tensor = 0.0
) -> Tensor:
    """λ (Q, 1) with Σ_i p_i(λ) = m = e^{log_target}, p_i = exp(log1p(ε·z_i·e^{ελ}) / ε − λ),
    from scaled = ε·z (Q, n), z ≤ 0 with row max 0 (−inf entries weigh nothing), ε = α − 1 > 0.

    The λ form of `entmax_bisect` (τ = −e^{−ελ}), exact to rounding as ε → 0. Newton on
    H(τ) = ‖[ε·z − τ]_+‖_{1/ε} / m^ε − 1, convex and decreasing, so from the left of the root
    (mass ≥ m) it rises monotonically to it with no bracket. With S = Σ p_i / (1 + u_i),
    u_i = ε·z_i·e^{ελ}: λ ← λ − log1p(−r) / ε, r = −(Σp)·expm1(−ε·log(Σp / m)) / S (softmax
    in one step). `start` (Q, 1) must have mass ≥ m; default λ = −log m (the top alone weighs m).
    """
    lam = torch.zeros_like(scaled[:, :1]) - log_target if start is None else start  # (Q, 1)
    tiny, tolerance = torch.finfo(scaled.dtype).tiny, newton_tolerance(scaled.dtype)
    for _ in range(NEWTON_STEPS if scaled.numel() else 0):
        p, u = entmax_weights_and_u(scaled, lam, eps)  # (Q, n) each
        mass = p.sum(dim=-1, keepdim=True)  # (Q, 1)
        slope = p.div_(u.add_(1).clamp_(min=tiny)).sum(dim=-1, keepdim=True)  # (Q, 1) S
        ratio = -mass * torch.expm1(-eps * (torch.log(mass) - log_target)) / slope  # (Q, 1) r
        step = -torch.log1p(-ratio) / eps  # (Q, 1)
        lam = lam + step
        if not bool(step.abs().amax() > tolerance * (1 + lam.abs().amax())):
            break
    return lam


def entmax_weights(scaled: Tensor, lam: Tensor, eps: float) -> Tensor:
    """Weights (Q, n) at λ (Q, 1) renormalised to sum 1."""
    p = entmax_weights_and_u(scaled, lam, eps)[0]  # (Q, n); the top entry is e^{−λ} > 0
    return p / p.sum(dim=-1, keepdim=True)


def entmax_weights_and_u(scaled: Tensor, lam: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """`_entmax_weights` (summing to about 1 when λ is the threshold) and u = ε·z·e^{ελ}
    clamped to ≥ −1, (Q, n) each, weights below e^f, f = log(smallest normal) + 2, exactly 0:
    the exponent is clamped at f and e^f subtracted, since torch's exp is 10–100× slower where
    its result underflows."""
    floor = math.log(torch.finfo(scaled.dtype).tiny) + 2
    u = (scaled * torch.exp(eps * lam)).clamp_(min=-1)  # (Q, n); −1 → log1p = −inf → weight 0
    p = torch.log1p(u).mul_(1 / eps).sub_(lam).clamp_(min=floor).exp_()
    p.sub_(math.exp(floor)).clamp_(min=0)  # torch's e^f may round below math.exp's
    return p, u


def _newton(z: Tensor, alpha: float) -> Tensor:
    """`entmax`'s weights (Q, M) of z (Q, M) with row max 0."""
    scaled = (alpha - 1) * z  # (Q, M) ε·z
    return entmax_weights(scaled, entmax_threshold(scaled, alpha - 1), alpha - 1)


# One halving per mantissa bit plus margin: λ in [0, log M] pinned to its dtype's rounding.
_BISECTION_STEPS = {torch.float32: 23 + 3, torch.float64: 52 + 3}


def _entmax_weights(scaled: Tensor, lam: Tensor, eps: float) -> Tensor:
    """Unnormalised weights exp(log1p(ε·z·e^{ελ}) / ε − λ) (Q, M) from scaled = ε·z, z ≤ 0,
    λ (Q, 1), ε = α − 1 > 0; 0 outside the support."""
    u = (scaled * torch.exp(eps * lam)).clamp_(min=-1)  # (Q, M); −1 → log1p = −inf → weight 0
    return torch.log1p_(u).mul_(1 / eps).sub_(lam).exp_()  # (Q, M)


def _bisect(z: Tensor, alpha: float) -> Tensor:
    """`entmax_bisect`'s weights (Q, M) of z (Q, M) with row max 0."""
    num_memories = z.shape[-1]
    eps = alpha - 1
    # τ = −exp(−ε·λ): p_i = exp(log1p(ε·z_i·e^{ελ}) / ε − λ) stays exact as ε → 0, where
    # [ε·z_i − τ]^{1/ε} loses every digit in float32. mass(lo = 0) ≥ 1 ≥ mass(hi = log M).
    scaled = eps * z  # (Q, M)
    lo = torch.zeros_like(z[:, :1])  # (Q, 1)
    hi = torch.full_like(z[:, :1], math.log(num_memories))  # (Q, 1)
    for _ in range(_BISECTION_STEPS[z.dtype]):
        mid = (lo + hi) / 2
        mass = _entmax_weights(scaled, mid, eps).sum(dim=-1, keepdim=True)  # (Q, 1)
        low_enough = mass >= 1
        lo = torch.where(low_enough, mid, lo)
        hi = torch.where(low_enough, hi, mid)
    p = _entmax_weights(scaled, lo, eps)  # (Q, M); mass(lo) ≥ 1, so no 0/0 below
    return p / p.sum(dim=-1, keepdim=True)


class _Entmax(torch.autograd.Function):
    """α-entmax by `solve` (`_bisect` or `_newton`) in float32 or float64; backward by the
    implicit function theorem: with g_i = p_i^{2−α} on the support (0 off it),
    ∂p/∂s = diag(g) − g gᵀ / Σ g."""

    @staticmethod
    def forward(ctx, scores: Tensor, alpha: float, solve: Callable) -> Tensor:
        compute = torch.float64 if scores.dtype == torch.float64 else torch.float32
        s = scores.to(compute)
        p = solve(s - s.amax(dim=-1, keepdim=True), alpha)  # (Q, M), from row max 0
        ctx.alpha = alpha
        ctx.save_for_backward(p)
        return p.to(scores.dtype)

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None, None]:
        (p,) = ctx.saved_tensors
        g = torch.where(p > 0, p.pow(2 - ctx.alpha), 0)  # (Q, M)
        weighted = g * grad_output.to(p.dtype)  # (Q, M)
        shift = weighted.sum(dim=-1, keepdim=True) / g.sum(dim=-1, keepdim=True)  # (Q, 1)
        return (weighted - shift * g).to(grad_output.dtype), None, None
