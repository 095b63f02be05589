"""The grid of the MIL experiment (`nphcli.experiments.mil`): the pooling rules compared, the
paper's and the quick protocol, and a preset with parts of its grid overridden from the CLI.
Reads no torch."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from nphcli.experiments.presets import chosen, labels, whole_numbers, with_counts
from nphcli.experiments.presets import preset as preset_named


@dataclass(frozen=True)
class Variant:
    """One pooling rule of the comparison: a label and the model with its parameters."""

    label: str  # name in results and plots
    model: str  # registry name
    params: dict[str, Any] = field(default_factory=dict)  # the model's parameters


# The paper's comparison. Random-masked keeps 20 % of each bag, the same share as top-20 %, so the
# two differ only in which instances they keep (the paper does not state its share).
VARIANTS = (
    Variant("dense", "dense"),
    Variant("sparse", "sparse"),
    Variant("topk-20%", "topk", {"k": 0.2}),
    Variant("topk-50%", "topk", {"k": 0.5}),
    Variant("topk-80%", "topk", {"k": 0.8}),
    Variant("random-feature", "random-feature", {"features": 256}),
    Variant("random-masked", "random", {"k": 0.2}),
    Variant("linear", "linear"),
)
# The rows of the paper's real-data MIL table (`nph paper mil`): these variants less
# random-masked (the paper leaves it out for its random inference).
PAPER_MIL_MODELS = tuple(v.label for v in VARIANTS if v.label != "random-masked")


@dataclass(frozen=True)
class MILConfig:
    """One experiment grid. `paper` is the paper's protocol; `quick` a scaled-down run."""

    bag_sizes: tuple[int, ...]  # M: digits per bag, one training run per size
    train_bags: int  # bags drawn from the train pool (half positive)
    test_bags: int  # bags drawn from the test pool
    epochs: int
    runs: int  # independent seeds per (model, bag size)
    batch_size: int = 256
    lr: float = 1e-3  # AdamW, cosine-decayed to 0 over all steps
    weight_decay: float = 1e-2  # AdamW's default
    embed_dim: int = 256  # instance embedding size (= heads · head_dim)
    heads: int = 4
    head_dim: int = 64
    prototypes: int = 2  # NPHPooling's learnable queries
    beta: float = 0.1  # the paper's "scaling"
    signal: int = 9  # the digit that makes a bag positive
    variants: tuple[str, ...] = tuple(v.label for v in VARIANTS)  # labels from VARIANTS
    convergence_bag_size: int = 50  # the bag size of the convergence plot


PRESETS = {
    "paper": MILConfig(
        bag_sizes=(5, 10, 20, 30, 50, 75, 100), train_bags=2000, test_bags=500, epochs=150, runs=10
    ),
    # The paper's numbers of bags and network, with 20 epochs (batch 128: 320 optimiser steps),
    # one run and bag sizes up to 30: all 8 models (time: measured.MEASURED["mil-quick"]).
    # Larger bags need more steps before any rule learns: run them with --bag-sizes 50,100
    # --epochs 60 (about an hour).
    "quick": MILConfig(
        bag_sizes=(5, 10, 20, 30),
        train_bags=2000,
        test_bags=500,
        epochs=20,
        runs=1,
        batch_size=128,
        convergence_bag_size=30,
    ),
}


def chosen_variants(config: MILConfig) -> list[Variant]:
    """The variants a config names, in its order; an unknown label is a user error."""
    return chosen(VARIANTS, config.variants, "MIL model")


def configure(
    preset: str,
    *,
    models: str | None = None,
    bag_sizes: str | None = None,
    epochs: int | None = None,
    runs: int | None = None,
) -> MILConfig:
    """A preset with any of its grid overridden (comma-separated strings as the CLI gives)."""
    config = preset_named(PRESETS, preset, "MIL preset")
    if models:
        config = replace(config, variants=labels(models))
        chosen_variants(config)
    if bag_sizes:
        sizes = whole_numbers(bag_sizes, "--bag-sizes")
        # The convergence plot stays at the preset's size when it is run, else the size nearest
        # the paper's 50.
        shown = config.convergence_bag_size
        if shown not in sizes:
            shown = min(sizes, key=lambda size: (abs(size - 50), size))
        config = replace(config, bag_sizes=sizes, convergence_bag_size=shown)
    return with_counts(config, epochs=epochs, runs=runs)
