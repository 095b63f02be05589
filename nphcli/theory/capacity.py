"""The capacity experiment: success against M for random patterns on a sphere, beside the
stated capacity (Hu et al. 2025, Proposition 4.1; Ramsauer et al. 2021, Theorem 3). The
statement, its constants and the reading tested are in docs/reproduction.md, "Proposition 4.1";
in short, for patterns of norm m = K·√(d − 1) and a failure probability p,

    a = 2/(d − 1)·(1 + ln(2βK²p(d − 1))),  b = 2K²β/5,  c = b / W₀(exp(a + ln b)),

and provided c ≥ (2/√p)^(4/(d − 1)), with probability 1 − p at least M* = √p·c^((d − 1)/4)
random patterns are stored and retrieved. Pattern μ counts as stored and retrieved when x ← T(x)
iterated from ξ_μ and from one point on the boundary of its sphere S_μ (radius 1/(βMm)) ends at
one fixed point (within ε) inside S_μ; Lemma A5's premise is counted for the same patterns.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nphcli.core.defaults import (
    CAPACITY_BETA,
    CAPACITY_DIM,
    CAPACITY_EPSILON,
    CAPACITY_K_RADIUS,
    CAPACITY_MODELS,
    CAPACITY_P,
    CAPACITY_SIZES,
    CAPACITY_STEPS,
    CAPACITY_TRIALS,
)
from nphcli.core.errors import NphError
from nphcli.schema.option import setting

if TYPE_CHECKING:  # torch is imported where it computes: the CLI reads the options torch-free
    import torch
    from torch import Tensor


def lambert_w0(z: float) -> float:
    """Principal branch W₀ of the Lambert W function for real z ≥ 0 (w·e^w = z), by Halley's
    iteration. The capacity constant needs only z = exp(a + ln b) > 0, and scipy is not a
    dependency, so this small solver stands in for scipy.special.lambertw."""
    if not (math.isfinite(z) and z >= 0):
        raise NphError(f"W₀ needs a finite z ≥ 0 here, got {z}")
    if z == 0:
        return 0.0
    w = math.log1p(z) if z < math.e else math.log(z) - math.log(math.log(z))
    for _ in range(100):
        ew = math.exp(w)
        f = w * ew - z
        step = f / (ew * (w + 1) - (w + 2) * f / (2 * w + 2))
        w -= step
        if abs(step) <= 1e-15 * max(1.0, abs(w)):
            break
    return w


def capacity_bound(d: int, radius: float, beta: float, p: float) -> dict[str, Any]:
    """Theorem 3's constants and M* = √p·c^((d−1)/4) for patterns of norm `radius` = K·√(d − 1).

    `condition_met` is the theorem's side condition c ≥ (2/√p)^(4/(d−1)) (equivalently M* ≥ 2);
    when it fails the theorem says nothing. M* is returned as a float (it can be astronomically
    large or below 1) together with log10 M*, so a vacuous bound is visible as a number."""
    if d < 2:
        raise NphError(f"--dim must be at least 2 (the bound has d − 1 in a denominator), got {d}")
    K = radius / math.sqrt(d - 1)
    a = 2 / (d - 1) * (1 + math.log(2 * beta * K**2 * p * (d - 1)))
    b = 2 * K**2 * beta / 5
    c = b / lambert_w0(math.exp(a + math.log(b)))
    log10_m_star = 0.5 * math.log10(p) + (d - 1) / 4 * math.log10(c)
    threshold = (2 / math.sqrt(p)) ** (4 / (d - 1))
    return {
        "K": K,
        "a": a,
        "b": b,
        "c": c,
        "c_min": threshold,
        "condition_met": c >= threshold,
        "M_star": 10**log10_m_star if log10_m_star < 300 else math.inf,
        "log10_M_star": log10_m_star,
    }


def sphere_patterns(M: int, d: int, radius: float, generator: torch.Generator) -> Tensor:
    """M patterns (M, d) uniform on the sphere of `radius` (normalised Gaussians, float64)."""
    import torch

    X = torch.randn(M, d, generator=generator, dtype=torch.float64)
    return X * (radius / torch.linalg.vector_norm(X, dim=1, keepdim=True))


def separation_premise(X: Tensor, beta: float) -> Tensor:
    """(M,) bool: Lemma A5's well-separation Δ_μ ≥ 2/(βM) + (1/β)·ln(2(M − 1)Mβm²), the premise
    under which Ramsauer et al. prove S_μ is mapped into itself (m = max ‖ξ_μ‖)."""
    import torch

    M = X.shape[0]
    if M < 2:
        return torch.ones(M, dtype=torch.bool)
    m = float(torch.linalg.vector_norm(X, dim=1).max())
    gram = X @ X.T  # (M, M)
    own = gram.diagonal().clone()  # (M,)
    gram.fill_diagonal_(-math.inf)
    delta = own - gram.max(dim=1).values  # (M,)
    threshold = 2 / (beta * M) + math.log(2 * (M - 1) * M * beta * m * m) / beta
    return delta >= threshold


def stored_and_retrieved(
    model: Any, X: Tensor, generator: torch.Generator, *, steps: int, epsilon: float
) -> dict[str, Tensor]:
    """Per pattern (M,) bools of the module docstring's test for `model` (any nph model whose
    values are its keys) on patterns X (M, d): `stored` (both runs at one fixed point in S_μ)
    and `at_target` (the end point from the boundary is nearer ξ_μ than any other pattern)."""
    import torch

    M, d = X.shape
    m = float(torch.linalg.vector_norm(X, dim=1).max())
    radius = 1 / (model.beta * M * m)  # S_μ of Ramsauer et al., Definition 3
    u = torch.randn(M, d, generator=generator, dtype=torch.float64)
    boundary = X + radius * u / torch.linalg.vector_norm(u, dim=1, keepdim=True)  # (M, d)
    iterate = dataclasses.replace(model, steps=steps, tol=0.0)
    once = dataclasses.replace(model, steps=1, tol=0.0)
    ends = {}
    for name, start in (("pattern", X), ("boundary", boundary)):
        x = iterate.retrieve(start, X).patterns  # (M, d)
        residual = torch.linalg.vector_norm(once.retrieve(x, X).patterns - x, dim=1)  # (M,)
        ends[name] = (x, residual <= epsilon)
    (x_p, fixed_p), (x_b, fixed_b) = ends["pattern"], ends["boundary"]
    agree = torch.linalg.vector_norm(x_p - x_b, dim=1) <= epsilon
    inside = torch.linalg.vector_norm(x_b - X, dim=1) <= radius
    nearest = torch.cdist(x_b, X).argmin(dim=1)  # (M,)
    return {"stored": fixed_p & fixed_b & agree & inside, "at_target": nearest == torch.arange(M)}


@dataclass(frozen=True, kw_only=True)
class CapacityRequest:
    """The experiment's settings; those declared with `setting` are `nph analyze --capacity`'s
    options (their help states the default, so the options themselves default to unset)."""

    dim: int = setting(
        CAPACITY_DIM, f"With --capacity: pattern dimension d [default: {CAPACITY_DIM}]."
    )
    radius: float | None = setting(  # None: K·√(d − 1) with K = CAPACITY_K_RADIUS
        None,
        "With --capacity: norm m of every pattern [default: "
        f"{CAPACITY_K_RADIUS:g}·√(d − 1), i.e. Ramsauer et al.'s K = {CAPACITY_K_RADIUS:g}].",
    )
    sizes: tuple[int, ...] = setting(  # the option is the comma list as written
        CAPACITY_SIZES,
        "With --capacity: comma list of pattern counts M "
        f"[default: {','.join(map(str, CAPACITY_SIZES))}].",
        kind="str",
    )
    trials: int = setting(
        CAPACITY_TRIALS, f"With --capacity: random pattern sets per M [default: {CAPACITY_TRIALS}]."
    )
    p: float = setting(
        CAPACITY_P,
        f"With --capacity: the failure probability p of the bound [default: {CAPACITY_P:g}].",
        name="failure_p",
    )
    epsilon: float = setting(
        CAPACITY_EPSILON,
        "With --capacity: ε of 'retrieved': fixed-point residual "
        f"and agreement tolerance [default: {CAPACITY_EPSILON:g}].".replace("e-0", "e-"),
    )
    beta: float = CAPACITY_BETA
    steps: int = CAPACITY_STEPS
    seed: int = 0
    models: tuple[str, ...] = CAPACITY_MODELS
    params: dict[str, Any] = field(default_factory=dict)  # e.g. {"k": 0.2} for topk

    def resolved_radius(self) -> float:
        """m: the given radius, or Ramsauer et al.'s K = 3 scaled to this dimension."""
        return CAPACITY_K_RADIUS * math.sqrt(self.dim - 1) if self.radius is None else self.radius

    def check(self) -> None:
        """Refuse settings the experiment cannot run with, before any work."""
        if self.dim < 2:
            raise NphError(f"--dim must be at least 2, got {self.dim}")
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise NphError(f"--beta must be > 0, got {self.beta}")
        radius = self.resolved_radius()
        if not (math.isfinite(radius) and radius > 0):
            raise NphError(f"--radius must be > 0, got {radius}")
        if not (0 < self.p <= 1):
            raise NphError(f"--failure-p must be in (0, 1], got {self.p}")
        if not self.sizes or any(M < 2 for M in self.sizes):
            raise NphError(f"--sizes must list pattern counts M ≥ 2, got {list(self.sizes)}")
        if self.trials < 1:
            raise NphError(f"--trials must be at least 1, got {self.trials}")
        if self.steps < 1:
            raise NphError(f"--fixed-point must be at least 1 step here, got {self.steps}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise NphError(f"--epsilon must be > 0, got {self.epsilon}")
        if max(self.sizes) * self.dim > 50_000_000:
            raise NphError("--sizes × --dim is too large for this experiment; lower them")


def run_capacity(request: CapacityRequest) -> dict[str, Any]:
    """Success against M per model, with M* and the premise counts (JSON-ready)."""
    from nphcli.models import create_model, get_model_info

    request.check()
    radius = request.resolved_radius()
    bound = capacity_bound(request.dim, radius, request.beta, request.p)
    models = {}
    for name in request.models:  # each model gets the parameters it takes: --k reaches topk alone
        takes = {p.name for p in get_model_info(name).params} - {"beta"}
        params = {key: value for key, value in request.params.items() if key in takes}
        models[name] = create_model(name, beta=request.beta, **params)
    rows = []
    for M in request.sizes:
        rows.extend(_rows_for_size(request, models, M, radius, bound))
    return {
        "capacity": {
            "statement": "Ramsauer et al. 2021, Theorem 3 (form of Hu et al. 2025, Prop. 4.1)",
            "d": request.dim,
            "radius": radius,
            "beta": request.beta,
            "p": request.p,
            "bound": bound,
            "sphere": "S_μ = {x : ‖x − ξ_μ‖ ≤ 1/(β·M·m)} (Ramsauer et al., Definition 3)",
            "steps": request.steps,
            "epsilon": request.epsilon,
            "trials": request.trials,
            "seed": request.seed,
            "models": {name: _describe(model) for name, model in models.items()},
            "rows": rows,
        }
    }


def _describe(model) -> dict[str, Any]:
    """The parameters a model ran with, for the JSON (β and any k, α, window...)."""
    skip = {"steps", "tol"}
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in skip}


def _rows_for_size(request, models, M: int, radius: float, bound) -> list[dict[str, Any]]:
    """One row per model at size M: over `trials` pattern sets (the same sets for every model,
    drawn from seed (seed, M, trial)), the fraction of sets where every pattern is stored and
    retrieved, the mean fraction of patterns, and the same two numbers for the premise."""
    import torch

    counts = {name: {"all": 0, "stored": 0.0, "at_target": 0.0} for name in models}
    premise_all, premise_mean = 0, 0.0
    for trial in range(request.trials):
        generator = torch.Generator().manual_seed(_trial_seed(request.seed, M, trial))
        X = sphere_patterns(M, request.dim, radius, generator)
        premise = separation_premise(X, request.beta)
        premise_all += int(premise.all())
        premise_mean += float(premise.double().mean()) / request.trials
        for name, model in models.items():
            seed = _trial_seed(request.seed, M, trial) + 1  # the boundary points' own stream
            query_generator = torch.Generator().manual_seed(seed)
            out = stored_and_retrieved(
                model, X, query_generator, steps=request.steps, epsilon=request.epsilon
            )
            counts[name]["all"] += int(out["stored"].all())
            counts[name]["stored"] += float(out["stored"].double().mean()) / request.trials
            counts[name]["at_target"] += float(out["at_target"].double().mean()) / request.trials
    return [
        {
            "model": name,
            "M": M,
            "below_bound": bound["condition_met"] and M <= bound["M_star"],
            "all_stored": c["all"] / request.trials,
            "stored_fraction": c["stored"],
            "at_target_fraction": c["at_target"],
            "premise_all": premise_all / request.trials,
            "premise_fraction": premise_mean,
        }
        for name, c in counts.items()
    ]


def _trial_seed(seed: int, M: int, trial: int) -> int:
    """A distinct, reproducible seed per (seed, M, trial), so adding sizes changes no other row."""
    return (seed * 1_000_003 + M * 1_009 + trial) % (2**63)
