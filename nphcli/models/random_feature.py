"""Performer FAVOR+ (Choromanski et al. 2021): positive random features for the softmax kernel.

With u = √β·x and φ(u) = exp(Wu − ‖u‖²/2)/√m for a projection W (m, d) whose rows are marginally
N(0, I), E[φ(u)ᵀφ(v)] = exp(uᵀv) = exp(β xᵀk), so

    T(x) = Σ_μ φ(√β x)ᵀφ(√β k_μ) v_μ / Σ_μ φ(√β x)ᵀφ(√β k_μ)

estimates dense retrieval, the error shrinking like 1/√m while β‖x‖‖k‖ is about 1 (a feature's
relative variance is exp(β‖x + k‖²) − 1). Linear in Q and M, like `linear`. W is block-orthogonal
(QR of Gaussian blocks, rows rescaled to chi-distributed norms: lower variance), drawn on the CPU
from --seed alone, so retrieval is deterministic on every device. The 1/√m factor and the
query's −‖u‖²/2 cancel in the ratio and are left out.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.core.resources import human_bytes, physical_memory
from nphcli.engine.features import feature_plan
from nphcli.engine.planning import Plan, itemsize, note_over_budget
from nphcli.engine.precision import accumulation_dtype
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import param
from nphcli.models.inputs import check_whole
from nphcli.models.linear import FeatureModel
from nphcli.models.registry import register_model


@functools.lru_cache(maxsize=16)
def _draw_projection(seed: int, features: int, dim: int) -> Tensor:
    """The (m, d) block-orthogonal Gaussian projection for `seed`, in float64 on the CPU."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    gaussians = torch.stack(
        [
            torch.randn(dim, dim, generator=generator, dtype=torch.float64)  # drawn one by one:
            for _ in range(-(-features // dim))  # the same stream for every dim
        ]
    )  # (blocks, d, d)
    q, r = torch.linalg.qr(gaussians)  # one batched call: a loop of small QRs took seconds
    # Fixing the signs of R's diagonal makes Q Haar-distributed, not biased by the QR routine.
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))  # (blocks, d)
    blocks = (q * signs[:, None, :]).transpose(-2, -1)  # (blocks, d, d), orthonormal rows
    directions = blocks.flatten(0, 1)[:features]  # (m, d)
    lengths = torch.randn(features, dim, generator=generator, dtype=torch.float64)  # (m, d)
    return directions * torch.linalg.vector_norm(lengths, dim=1, keepdim=True)  # (m, d)


@functools.lru_cache(maxsize=16)
def _projection_on(
    seed: int, features: int, dim: int, device: torch.device, dtype: torch.dtype
) -> Tensor:
    return _draw_projection(seed, features, dim).to(device=device, dtype=dtype)


@register_model(
    "random-feature",
    summary="Performer FAVOR+ positive random features; approaches dense as --features grows",
    formula=(
        "T(x) = Vᵀφ(√β K)φ(√β x) / 1ᵀφ(√β K)φ(√β x), φ(u) = exp(Wu − ‖u‖²/2)/√m, "
        "W (m, d) block-orthogonal Gaussian"
    ),
    cost="time O((Q+M)·m·(d+d_v)); extra memory O((Q+M)·m + m·d_v), no Q×M scores",
)
@dataclass(kw_only=True)
class RandomFeature(FeatureModel):
    """Softmax retrieval estimated with m positive random features; see the module docstring."""

    features: int = param(
        256, "number m of random features; more features bring the result closer to dense (~1/√m)"
    )
    seed: int = param(0, "seed of the random projection W; the same seed gives the same W")
    summary_params = ("beta", "features", "seed")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_whole(self.features, "--features", 1)
        check_whole(self.seed, "--seed", 0, 2**63)

    def projection(
        self, dim: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64
    ) -> Tensor:
        """The (m, d) projection W for pattern dimension `dim`; a function of (seed, m, d) only."""
        return _projection_on(self.seed, self.features, dim, torch.device(device), dtype)

    def log_features(self, x: Tensor, scale: float | Tensor, *, keys: bool) -> Tensor:
        """(scale·x) Wᵀ, less ‖scale·k‖²/2 for keys (the query's cancels in the ratio)."""
        weights = self.projection(x.shape[-1], x.device, x.dtype)  # (m, d)
        scaled = scale * x  # (…, d)
        logits = scaled @ weights.T  # (…, m)
        return logits - 0.5 * (scaled * scaled).sum(-1, keepdim=True) if keys else logits

    def plan(self, num_queries: int, bank: MemoryBank, budget: int) -> Plan:
        compute = itemsize(accumulation_dtype(bank.dtype))  # the projection, float64 and cast:
        held = self.features * bank.dim * (8 + compute)
        summary = 4 * self.features * (bank.value_dim + 1) * compute  # see `feature_plan`
        needed = held + summary  # no block size lowers it: the features alone take it
        room = physical_memory()
        if room is not None and needed > room:  # it could never be allocated
            raise NphError(
                f"--features {self.features} needs {human_bytes(needed)} of working memory at "
                f"d = {bank.dim} (its projection and feature summary), more than the "
                f"--memory-budget of {human_bytes(budget)} and this machine's "
                f"{human_bytes(room)}; lower --features"
            )
        smallest = f"--features {self.features}'s projection and feature summary at d = {bank.dim}"
        note_over_budget(budget, needed, smallest)
        return feature_plan(num_queries, bank, budget, features=self.features, held=held)
