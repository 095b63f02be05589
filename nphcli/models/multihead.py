"""Multi-head dense retrieval: H independent softmax retrievals on contiguous slices of the pattern.

Head h computes softmax(β X_h K_hᵀ) V_h on slices of d/H and d_v/H, so a query can combine parts
of different memories; H = 1 is `dense`. β is not rescaled per head (a head's scores are about
H times smaller than dense's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from nphcli.core.errors import NphError
from nphcli.memory.bank import MemoryBank
from nphcli.models.base import param
from nphcli.models.dense import SoftmaxHeads
from nphcli.models.inputs import check_whole
from nphcli.models.registry import register_model


@register_model(
    "multihead",
    summary="dense softmax on H contiguous slices of the dimensions, outputs concatenated",
    formula="T(x) = concat_h V_hᵀ softmax(β K_h x_h), slices h = 1..H of d and d_v",
    cost="time O(Q·M·d + H·Q·M); extra memory O(Q·d_v) fused, else blocks of O(H·Q·B)",
)
@dataclass(kw_only=True)
class MultiHead(SoftmaxHeads):
    """Dense retrieval per slice of the dimensions; see the module docstring."""

    heads: int = param(
        1, "number H of heads, each on d/H contiguous dimensions; must divide d and d_v"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_whole(self.heads, "--heads", 1)

    def check_memory(self, memory: MemoryBank) -> None:
        check_divides(self.heads, memory.dim, memory.value_dim)

    def associate(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        beta: Tensor,
        valid: Tensor,
        positions: Tensor,
        dropout: Callable[[Tensor], Tensor] | None = None,
    ) -> Tensor:
        """Dense retrieval on `heads` slices of each of the H' given heads, concatenated:
        (B, H', N, d_v)."""
        check_divides(self.heads, q.shape[-1], v.shape[-1])
        slices = self.heads

        def split(x: Tensor) -> Tensor:  # (B, H', rows, w) -> (B, H'·slices, rows, w / slices)
            return x.unflatten(-1, (slices, -1)).transpose(-3, -2).flatten(1, 2)

        if beta.ndim:  # one β per given head (H', 1, 1): each of its slices takes it
            beta = beta.repeat_interleave(slices, dim=-3)
        out = super().associate(
            split(q),
            split(k),
            split(v),
            beta=beta,
            valid=valid,
            positions=positions,
            dropout=dropout,
        )  # (B, H'·slices, N, d_v / slices)
        return out.unflatten(1, (-1, slices)).transpose(-3, -2).flatten(-2)  # (B, H', N, d_v)


def check_divides(heads: int, dim: int, value_dim: int) -> None:
    """Refuse a number of heads that does not divide the pattern and value dimensions."""
    if dim % heads:
        raise NphError(
            f"--heads {heads} does not divide the pattern dimension {dim}; "
            f"use a divisor of {dim} such as {_divisors(dim)}"
        )
    if value_dim % heads:
        raise NphError(
            f"--heads {heads} does not divide the value dimension {value_dim}; "
            f"use a divisor of both {dim} and {value_dim}"
        )


def _divisors(n: int, limit: int = 8) -> str:
    found = [str(k) for k in range(1, n + 1) if n % k == 0][:limit]
    return ", ".join(found)
