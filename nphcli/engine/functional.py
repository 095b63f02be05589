"""Maps from scores to weights on the probability simplex: the functional core of the models.

Each function turns scores `(Q, M)` row by row into weights `(Q, M)` with rows in the simplex
Δ = {p : p ≥ 0, Σ p = 1}. All of them are invariant to adding a constant to a row, so they
subtract the row maximum first: no exp overflows and no threshold loses precision, from β = 1e-6
to 1e4. They compute in float32 or float64 (models receive half inputs already upcast).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax restricted to `mask` (Q, M) bool: p_i = exp(s_i) / Σ_{j∈mask} exp(s_j) for i in
    the mask and exactly 0 outside it, i.e. argmax_{p∈Δ, supp p ⊆ mask} pᵀs − Σ p_j log p_j.

    Every row must keep at least one memory; a row keeping one gives it weight 1 without NaN.
    Masked entries are set to −inf rather than 0: a logit of 0 would still give them weight.
    """
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def sparsemax(scores: Tensor) -> Tensor:
    """Euclidean projection of each row onto the simplex: p = argmin_{p∈Δ} ‖p − s‖²
    (Martins & Astudillo 2016).

    Closed form p_i = [s_i − τ]_+ with the scores sorted as z_(1) ≥ … ≥ z_(M),
    k* = max{k : 1 + k·z_(k) > Σ_{j≤k} z_(j)} and τ = (Σ_{j≤k*} z_(j) − 1) / k*.
    Memories below τ get weight exactly 0. Differentiable with the closed-form Jacobian
    ∂p/∂s = diag(1_S) − 1_S 1_Sᵀ / |S| on the support S (`_Sparsemax`), as the entmax package does.
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
    """Sparsemax forward (`sparsemax` itself, run without autograd); backward in closed form:
    the vector-Jacobian product is g ↦ 1_S ⊙ (g − Σ_S g / |S|), with no pass through the sort."""

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

    The solution is p_i = [(α−1)·s_i − τ]_+^{1/(α−1)} with τ set so that Σ p = 1; τ is found by
    bisection, in float64 for float64 scores and float32 otherwise, with one halving per
    mantissa bit (plus margin) so it is exact to rounding, then p is renormalised. The power is
    evaluated as exp(log1p(·)/(α−1)), accurate in float32 even for α − 1 = 1e-12.
    α = 1 is softmax (returned directly) and α = 2 is sparsemax.
    """
    if alpha == 1:
        return torch.softmax(scores, dim=-1)
    return _EntmaxBisect.apply(scores, float(alpha))


def entmax(scores: Tensor, alpha: float) -> Tensor:
    """α-entmax of each row, the same map as `entmax_bisect` (which stays as its slow, obvious
    reference), with τ found by a safeguarded Newton iteration (`entmax_threshold`): a handful of
    passes over the scores instead of one per mantissa bit. Same autograd (implicit function)."""
    if alpha == 1:
        return torch.softmax(scores, dim=-1)
    return _EntmaxNewton.apply(scores, float(alpha))


# Newton steps allowed; from the left the iteration converges monotonically, in 1 (softmax) to
# about 10 steps over the whole range of α and β, so this is a bound, not a budget.
NEWTON_STEPS = 100


def newton_tolerance(dtype: torch.dtype) -> float:
    """`entmax_threshold` stops when a step moves λ by less than this times 1 + |λ|."""
    return 4 * torch.finfo(dtype).eps


def entmax_threshold(
    scaled: Tensor, eps: float, *, start: Tensor | None = None, log_target: float | Tensor = 0.0
) -> Tensor:
    """λ (Q, 1) with Σ_i p_i(λ) = m = e^{log_target}, p_i = exp(log1p(ε·z_i·e^{ελ}) / ε − λ),
    from scaled = ε·z (Q, n), z ≤ 0 with row max 0 (−inf entries weigh nothing), ε = α − 1 > 0.

    The λ form of `entmax_bisect` (τ = −e^{−ελ}), exact to rounding as ε → 0. Newton runs on
    H(τ) = (Σ p / m)^ε − 1 = ‖[ε·z − τ]_+‖_{1/ε} / m^ε − 1, a norm of a vector convex in τ,
    hence convex and decreasing: from any τ left of the root (mass ≥ m) every Newton step stays
    left of it and the iteration rises monotonically to it, with no bracket to keep. With
    S = Σ p_i / (1 + u_i), u_i = ε·z_i·e^{ελ}, the step is
        λ ← λ − log1p(−r) / ε,   r = −(Σp)·expm1(−ε·log(Σp / m)) / S,
    one pass over the scores per step; at ε → 0 it is λ ← λ + log(Σp / m), exact for softmax in
    one step. `start` (Q, 1) must have mass ≥ m; by default λ = −log m (the top entry alone has
    weight m). Stops when λ no longer moves.
    """
    lam = torch.zeros_like(scaled[:, :1]) - log_target if start is None else start  # (Q, 1)
    tiny, tolerance = torch.finfo(scaled.dtype).tiny, newton_tolerance(scaled.dtype)
    for _ in range(NEWTON_STEPS if scaled.numel() else 0):
        p, u = _weights_and_u(scaled, lam, eps)  # (Q, n) each
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
    p = entmax_unnormalised(scaled, lam, eps)  # (Q, n); the top entry is e^{−λ} > 0
    return p / p.sum(dim=-1, keepdim=True)


def entmax_unnormalised(scaled: Tensor, lam: Tensor, eps: float) -> Tensor:
    """Weights (Q, n) at λ (Q, 1), summing to about 1 when λ is the threshold."""
    return _weights_and_u(scaled, lam, eps)[0]


def _weights_and_u(scaled: Tensor, lam: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """`_entmax_weights` and u = ε·z·e^{ελ} clamped to ≥ −1, (Q, n) each, with every weight
    below e^{f}, f = log(smallest normal) + 2, set to exactly 0. torch's exp is one to two
    orders of magnitude slower on arguments whose result underflows (−inf included) than on
    others; the exponent is clamped at f and e^f subtracted, which leaves the kept weights
    within 1e-37 (float32) of their value and makes those at or below e^f exactly 0."""
    floor = math.log(torch.finfo(scaled.dtype).tiny) + 2
    u = (scaled * torch.exp(eps * lam)).clamp_(min=-1)  # (Q, n); −1 → log1p = −inf → weight 0
    p = torch.log1p(u).mul_(1 / eps).sub_(lam).clamp_(min=floor).exp_()
    p.sub_(math.exp(floor)).clamp_(min=0)  # torch's e^f may round below math.exp's
    return p, u


class _EntmaxNewton(torch.autograd.Function):
    """Forward by `entmax_threshold`; backward as `_EntmaxBisect`'s."""

    @staticmethod
    def forward(ctx, scores: Tensor, alpha: float) -> Tensor:
        compute = torch.float64 if scores.dtype == torch.float64 else torch.float32
        s = scores.to(compute)
        scaled = (alpha - 1) * (s - s.amax(dim=-1, keepdim=True))  # (Q, M) ε·z, row max 0
        p = entmax_weights(scaled, entmax_threshold(scaled, alpha - 1), alpha - 1)
        ctx.alpha = alpha
        ctx.save_for_backward(p)
        return p.to(scores.dtype)

    backward = staticmethod(lambda ctx, grad_output: _EntmaxBisect.backward(ctx, grad_output))


# One halving per mantissa bit plus margin: the bracket [0, log M] is at most ~50 wide and λ is
# stored to relative rounding, so this many steps pins λ as well as its dtype can hold it.
_BISECTION_STEPS = {torch.float32: 23 + 3, torch.float64: 52 + 3}


def _entmax_weights(scaled: Tensor, lam: Tensor, eps: float) -> Tensor:
    """Unnormalised α-entmax weights exp(log1p(ε·z·e^{ελ}) / ε − λ) from scaled = ε·z (Q, M),
    z ≤ 0 the shifted scores, thresholds λ (Q, 1) and ε = α − 1 > 0; 0 where ε·z·e^{ελ} ≤ −1
    (outside the support)."""
    u = (scaled * torch.exp(eps * lam)).clamp_(min=-1)  # (Q, M); −1 → log1p = −inf → weight 0
    return torch.log1p_(u).mul_(1 / eps).sub_(lam).exp_()  # (Q, M)


class _EntmaxBisect(torch.autograd.Function):
    """Forward by bisection; backward from the implicit function theorem, not through the loop.

    With g_i = p_i^{2−α} on the support (0 off it), ∂p/∂s = diag(g) − g gᵀ / Σ g; at α = 2 this is
    sparsemax's Jacobian and as α → 1 softmax's.
    """

    @staticmethod
    def forward(ctx, scores: Tensor, alpha: float) -> Tensor:
        compute = torch.float64 if scores.dtype == torch.float64 else torch.float32
        s = scores.to(compute)
        z = s - s.amax(dim=-1, keepdim=True)  # (Q, M), row max 0
        num_memories = z.shape[-1]
        eps = alpha - 1
        # Written as τ = −exp(−ε·λ) with ε = α − 1, the weights are
        #   p_i = [ε·z_i − τ]_+^{1/ε} = exp(log1p(ε·z_i·e^{ελ}) / ε − λ),
        # which stays exact to rounding as ε → 0 (it tends to exp(z_i − λ), softmax), where
        # forming ε·z_i − τ ≈ 1 first and raising it to 1/ε loses every digit in float32.
        # λ = 0 gives the top memory weight 1 (mass ≥ 1); λ = log M gives every memory weight
        # ≤ 1/M (mass ≤ 1). The bracket [lo, hi] keeps mass(lo) ≥ 1 ≥ mass(hi).
        scaled = eps * z  # (Q, M)
        lo = torch.zeros_like(z[:, :1])  # (Q, 1)
        hi = torch.full_like(z[:, :1], math.log(num_memories))  # (Q, 1)
        for _ in range(_BISECTION_STEPS[compute]):
            mid = (lo + hi) / 2
            mass = _entmax_weights(scaled, mid, eps).sum(dim=-1, keepdim=True)  # (Q, 1)
            low_enough = mass >= 1
            lo = torch.where(low_enough, mid, lo)
            hi = torch.where(low_enough, hi, mid)
        p = _entmax_weights(scaled, lo, eps)  # (Q, M); mass(lo) ≥ 1, so no 0/0 below
        p = p / p.sum(dim=-1, keepdim=True)
        ctx.alpha = alpha
        ctx.save_for_backward(p)
        return p.to(scores.dtype)

    @staticmethod
    def backward(ctx, grad_output: Tensor) -> tuple[Tensor, None]:
        (p,) = ctx.saved_tensors
        g = torch.where(p > 0, p.pow(2 - ctx.alpha), 0)  # (Q, M)
        weighted = g * grad_output.to(p.dtype)  # (Q, M)
        shift = weighted.sum(dim=-1, keepdim=True) / g.sum(dim=-1, keepdim=True)  # (Q, 1)
        return (weighted - shift * g).to(grad_output.dtype), None
