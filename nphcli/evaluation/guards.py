"""Checks that keep numbers honest: inputs a retrieval cannot represent are refused before any
model runs, and results or metrics that still overflow are errors, never NaN or null in a report.
Also the notice when the default β meets patterns of a very different scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nphcli.core.defaults import DEFAULT_BETA, DEFAULT_BETA_NORM2
from nphcli.core.dtypes import dtype_name
from nphcli.core.errors import NphError, NphRuntimeError
from nphcli.core.notices import notice
from nphcli.evaluation.metrics import metric_dtype
from nphcli.memory.bank import MemoryBank


@dataclass
class MemoryScale:
    """Magnitudes of a memory's entries, from one pass over its blocks (in float64)."""

    key_abs: float  # max |K_μi|
    key_norm: float  # max ‖K_μ‖₂
    mean_norm2: float  # mean ‖K_μ‖₂²
    value_abs: float  # max |V_μi| (the keys' for auto-association)
    value_min: float  # min V_μi: with value_max, the range `pixel_success` clamps to
    value_max: float  # max V_μi


def memory_scale(bank: MemoryBank, rows: int = 1 << 13) -> MemoryScale:
    """The magnitudes `check_range` and `check_default_beta` need, reading each block once."""
    key_abs = key_norm = value_abs = total = 0.0
    value_min, value_max = math.inf, -math.inf
    for start, keys, values in bank.blocks(rows):
        low, high, peak = float(values.min()), float(values.max()), float(keys.abs().max())
        if math.isnan(low) or math.isnan(peak):  # min() and max() of floats would hide a NaN
            _name_nan_row(start, keys, values)
        value_min, value_max = min(value_min, low), max(value_max, high)
        key_abs = max(key_abs, peak)
        norm2 = keys.to(metric_dtype(keys)).square().sum(dim=1)  # (b,)
        if not bool(torch.isfinite(norm2).all()):  # beyond float32: exact in float64
            norm2 = keys.to(torch.float64).square().sum(dim=1)
        key_norm = max(key_norm, math.sqrt(float(norm2.max())))
        total += float(norm2.to(torch.float64).sum())
        if bank.hetero:
            value_abs = max(value_abs, float(values.abs().max()))
    if bank.collective.world_size > 1:  # rows spread over ranks: combine every rank's pass
        peaks = bank.collective.all_max(
            torch.tensor([key_abs, key_norm, value_abs, -value_min, value_max], dtype=torch.float64)
        )
        key_abs, key_norm, value_abs, negative_min, value_max = peaks.tolist()
        value_min = -negative_min
        total = float(bank.collective.all_sum(torch.tensor([total], dtype=torch.float64)))
    mean_norm2 = total / bank.num_memories
    value_abs = value_abs if bank.hetero else key_abs
    return MemoryScale(key_abs, key_norm, mean_norm2, value_abs, value_min, value_max)


def _name_nan_row(start: int, keys: Tensor, values: Tensor) -> None:
    """NphError naming the first memory row (of a block starting at `start`) holding NaN."""
    for label, rows in (("patterns", keys), ("values", values)):
        bad = rows.isnan().any(dim=1)  # (b,)
        if bool(bad.any()):
            row = start + int(bad.nonzero()[0, 0])
            raise NphError(
                f"the memory's {label} row {row} holds NaN: every pattern must be finite; drop "
                "or repair that row"
            )


def check_default_beta(
    beta_given: bool, takes_beta: bool, norm2: float, recall: dict | None = None
) -> None:
    """A notice when the default β meets patterns of a very different scale than it was
    chosen for (e.g. unit-norm or z-scored memories), with the β that would match. `norm2`:
    the patterns' mean ‖ξ‖²; `recall`: the model and β a memory of texts records for recall
    (`nph recall`), named first where it has one."""
    if beta_given or not takes_beta:
        return
    if norm2 > 0 and not 0.1 <= norm2 / DEFAULT_BETA_NORM2 <= 10:
        suggested = DEFAULT_BETA * DEFAULT_BETA_NORM2 / norm2
        advice = f"consider --beta {suggested:.2g}"
        if isinstance(recall, dict) and {"model", "beta"} <= set(recall):
            advice = (
                f"this memory records --model {recall['model']} --beta {recall['beta']:g} for "
                f"recall (docs/text.md); or {advice}"
            )
        notice(
            f"the default β = {DEFAULT_BETA} suits patterns with mean ‖ξ‖² ≈ "
            f"{DEFAULT_BETA_NORM2:g} (MNIST in [0, 1]); these have {norm2:.3g}, so {advice}"
        )


def check_range(scale: MemoryScale, queries: Tensor, beta: float, dtype: torch.dtype) -> None:
    """Refuse, before any model runs, numbers the retrieval cannot represent.

    Memories and queries must be finite once cast to `dtype`. The scores β⟨x, ξ⟩, and the inner
    products ⟨x, ξ⟩ they are made from, are bounded by max(1, β)·max‖x‖·max‖ξ‖ (Cauchy–Schwarz)
    and must fit the dtype models accumulate in: float32 for half precision, else `dtype`. For
    half inputs float32 is the right limit, not the half dtype's: β scales the float32 product
    and a half product past its range is redone in float32 (`engine.precision`).
    """
    name, most = dtype_name(dtype), torch.finfo(dtype).max
    rows = queries.to(torch.float64)  # (Q, d)
    for what, largest in (
        ("the memory's patterns", scale.key_abs),
        ("the memory's values", scale.value_abs),
        ("the queries", float(rows.abs().max())),
    ):
        if torch.isinf(torch.tensor(largest, dtype=torch.float64).to(dtype)):
            raise NphError(
                f"{what} reach {largest:.4g}, beyond the largest {name} ({most:.4g}); use "
                "--dtype float32 or bfloat16, or store the patterns rescaled "
                "(nph store --normalize)"
            )
    accumulate = dtype if dtype == torch.float64 else torch.float32
    bound = max(1.0, beta) * float(rows.square().sum(dim=1).max().sqrt()) * scale.key_norm
    if not bound <= torch.finfo(accumulate).max:
        raise NphError(
            f"scores β⟨x, ξ⟩ of these patterns may reach {bound:.3g} and overflow "
            f"{dtype_name(accumulate)} (largest {torch.finfo(accumulate).max:.3g}); store the "
            "patterns rescaled (nph store --normalize l2 or zscore) or use --dtype float64"
        )


def check_finite(model: str, dtype: torch.dtype, result: Tensor, per_query: dict) -> None:
    """What the inputs allowed but a model or a metric still could not represent is an error,
    never a NaN or a null in the report."""
    bad = ~torch.isfinite(result).all(dim=1)  # (Q,)
    if bool(bad.any()):
        raise NphRuntimeError(
            f"model {model!r} produced non-finite values (NaN or infinity) for "
            f"{int(bad.sum())} of {bad.shape[0]} queries at --dtype {dtype_name(dtype)}; try "
            "--dtype float64, a smaller --beta, or patterns stored rescaled (nph store --normalize)"
        )
    for metric, values in per_query.items():
        if values.is_floating_point() and not bool(torch.isfinite(values).all()):
            raise NphRuntimeError(
                f"the {metric} metric overflows {dtype_name(values.dtype)} for patterns of this "
                "magnitude; store them rescaled (nph store --normalize) or use --dtype float64"
            )


def check_noise_clip(corruption: Any, scale: MemoryScale, hetero: bool) -> None:
    """`--noise-clip` clamps noisy queries to [0, 1], the pixel range of the paper's released
    code. On a memory whose queries (its keys) leave [0, 1], such as `centered` pixels in
    [−0.5, 0.5], it moves every query away from its pattern (dense, σ = 0.5: success 0.99 →
    0.77), silently: refused instead. Without noise nothing is clamped, so nothing to refuse."""
    if not corruption.noise_clip or corruption.noise == 0:
        return
    tolerance = 1e-6  # rounding of a [0, 1] normalisation in float32
    if hetero:  # the keys' sign is not measured: only their magnitude
        outside, held = scale.key_abs > 1 + tolerance, f"keys reach |x| = {scale.key_abs:.3g}"
    else:
        outside = scale.value_min < -tolerance or scale.value_max > 1 + tolerance
        held = f"values lie in [{scale.value_min:.3g}, {scale.value_max:.3g}]"
    if outside:
        raise NphError(
            f"--noise-clip clamps noisy queries to [0, 1], but this memory's {held}: clamping "
            "would move every query off its pattern; drop --noise-clip, or store the memory "
            "with --normalize minmax (pixels in [0, 1], the paper's scale)"
        )
