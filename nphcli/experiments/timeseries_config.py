"""The grid of the time-series experiment (`nphcli.experiments.timeseries_run`): the eight models
of the paper's table, the paper's and the quick protocol, and a preset with parts of its grid
overridden from the CLI. Reads no torch. What the paper states and what is taken from the
authors' released code where it is silent: docs/reproduction-timeseries.md ("The protocol").
Neither states the number of epochs; `paper` trains 10.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from nphcli.core.errors import NphError
from nphcli.experiments.presets import chosen, labels, whole_numbers, with_counts
from nphcli.experiments.presets import preset as preset_named

# The Window size per horizon (the paper's "8, 12, 14, 16 w.r.t. 96, 196, 336, 720"; its table
# says 192). The released code passes it as Longformer's one-sided window w, so it is nph's
# `window` (the half-width) as it stands.
WINDOW_SIZES = {96: 8, 192: 12, 336: 14, 720: 16}


@dataclass(frozen=True)
class Variant:
    """One column of the paper's table: a label, the model and its parameters, and the model
    of the pooling layer when it is not the same (Window, as in the released code: a window
    around the pooling query's position 0 would see only the oldest time steps)."""

    label: str  # name in results, tables and plots
    model: str  # registry name
    params: dict[str, Any] = field(default_factory=dict)
    pool_model: str | None = None  # None: the pooling uses `model` with `params`
    # Attention dropout (on the weights, in training) of the layer and of the pooling, as the
    # released model: its Hopfield layer takes the run's dropout (Dense 0.2, Sparse 0.1), its
    # HopfieldPooling keeps its default 0.1 (Dense, Sparse and Window's sparsemax pooling).
    dropout: float = 0.0
    pool_dropout: float = 0.0


VARIANTS = (
    Variant("dense", "dense", dropout=0.2, pool_dropout=0.1),
    Variant("sparse", "sparse", dropout=0.1, pool_dropout=0.1),
    Variant("topk-20%", "topk", {"k": 0.2}),
    Variant("topk-50%", "topk", {"k": 0.5}),
    Variant("topk-80%", "topk", {"k": 0.8}),
    Variant("window", "window", pool_model="sparse", pool_dropout=0.1),
    Variant("random-feature", "random-feature"),
    Variant("linear", "linear"),
)


def window_size(horizon: int) -> int:
    """The paper's Window size for a horizon; for another horizon, that of the largest paper
    horizon not above it (8 below 96)."""
    known = [h for h in sorted(WINDOW_SIZES) if h <= horizon]
    return WINDOW_SIZES[known[-1]] if known else WINDOW_SIZES[96]


# How the series is cut into training, validation and test parts (`timeseries.prepare`).
SPLITS = ("months", "ratio")  # 12 / 4 / 4 months of 30 days; 70 / 10 / 20 %


@dataclass(frozen=True)
class TSConfig:
    """One experiment grid. `paper` is the paper's protocol; `quick` a scaled-down run."""

    horizons: tuple[int, ...]  # H, predicted steps; the input length is H too
    epochs: int
    runs: int  # independent seeds per (model, horizon)
    target: str = "OT"  # the predicted column
    split: str = "ratio"  # one of SPLITS; ratio: the released code's (see `timeseries`)
    batch_size: int = 128
    lr: float = 1e-3  # AdamW, cosine-decayed to 0 over the epochs
    weight_decay: float = 1e-2  # AdamW's default
    clip: float = 5.0  # gradient norm clipping
    d_model: int = 64  # the embedding width (= heads · head_dim)
    heads: int = 4
    beta: float = 0.1  # the released code's "scale"
    variants: tuple[str, ...] = tuple(v.label for v in VARIANTS)

    @property
    def features(self) -> int:
        """Random features per head: Performer's default m = d_h · ln d_h."""
        head_dim = self.d_model // self.heads
        return max(1, int(head_dim * math.log(head_dim)))


PRESETS = {
    "paper": TSConfig(horizons=(96, 192, 336, 720), epochs=10, runs=5),
    # Horizon 96, one run, every model, 6 epochs: a smoke test of the pipeline.
    "quick": TSConfig(horizons=(96,), epochs=6, runs=1),
}


def chosen_variants(config: TSConfig) -> list[Variant]:
    """The variants a config names, in its order; an unknown label is a user error."""
    return chosen(VARIANTS, config.variants, "model")


def configure(
    preset: str,
    *,
    models: str | None = None,
    horizons: str | None = None,
    epochs: int | None = None,
    runs: int | None = None,
    target: str | None = None,
    split: str | None = None,
) -> TSConfig:
    """A preset with any of its grid overridden (comma-separated strings as the CLI gives)."""
    config = preset_named(PRESETS, preset, "time-series preset")
    if models:
        config = replace(config, variants=labels(models))
        chosen_variants(config)
    if horizons:
        config = replace(config, horizons=whole_numbers(horizons, "--horizons"))
    config = with_counts(config, epochs=epochs, runs=runs)
    if split is not None:
        if split not in SPLITS:
            raise NphError(f"--split must be {' or '.join(SPLITS)}, got {split!r}")
        config = replace(config, split=split)
    if target is not None:
        config = replace(config, target=target)
    return config
