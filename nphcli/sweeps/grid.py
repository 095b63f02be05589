"""The sweep grid: its settings, the (setting, trial) tasks in run order, and their seeds.

The grid (`nphcli.sweeps.config.SweepConfig`) expands into settings, one per combination of a
model setting (a model and one value of each parameter it sweeps), a memory size M, a mask
fraction, a noise σ and a β. Each setting runs once per trial.

Seeds. Everything follows from the sweep's one `seed` and the trial index t:

    memory_seed(t) = SeedSequence([seed, t, 0]),  run_seed(t) = SeedSequence([seed, t, 1])

each the first 64-bit word of numpy's `SeedSequence(...).generate_state`, with the top bit
cleared (seeds stay below 2⁶³, which every model accepts). The memory seed picks the trial's
memories (`nphcli.sweeps.pool.draw_memory`); the run seed drives `evaluate` (query choice, mask
and noise, and the model's own seed for `random` and `random-feature`), so all models of a
trial see the same memory and the same corrupted queries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nphcli.errors import NphError
from nphcli.sweeps.config import SweepConfig


@dataclass(frozen=True)
class Setting:
    """One point of the grid (everything but the trial)."""

    model: str
    params: tuple[tuple[str, Any], ...]  # the swept parameters of this model setting
    size: int  # memory size M
    mask: float
    noise: float  # σ
    beta: float
    mask_mode: str | None

    @property
    def label(self) -> str:
        """The model setting, e.g. `topk k=0.2`: one line of a plot."""
        return " ".join([self.model, *(f"{k}={_text(v)}" for k, v in self.params)])

    @property
    def key(self) -> str:
        """The setting's identity in a results file (with the trial, a row's key)."""
        mode = self.mask_mode or "default"
        return (
            f"{self.label} | M={self.size} | mask={_text(self.mask)} {mode} | "
            f"noise={_text(self.noise)} | beta={_text(self.beta)}"
        )


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def expand(config: SweepConfig) -> list[Setting]:
    """The grid's settings in run order: size, mask, noise, β, then model settings."""
    settings = []
    for size in config.sizes:
        for mask in config.mask:
            for noise in config.noise:
                for beta in config.beta:
                    for spec in config.models:
                        for params in spec.settings():
                            settings.append(
                                Setting(
                                    spec.name,
                                    tuple(params.items()),
                                    size,
                                    mask,
                                    noise,
                                    beta,
                                    config.mask_mode,
                                )
                            )
    keys = [s.key for s in settings]
    if len(set(keys)) != len(keys):
        duplicate = next(k for k in keys if keys.count(k) > 1)
        raise NphError(f"the grid lists one setting twice ({duplicate}); remove the repeat")
    return settings


@dataclass(frozen=True)
class Task:
    """One run: a setting in one trial."""

    setting: Setting
    trial: int

    @property
    def key(self) -> tuple[str, int]:
        """(setting key, trial): how a results file tells which runs are done."""
        return (self.setting.key, self.trial)


def plan(config: SweepConfig) -> list[Task]:
    """Every (setting, trial) in run order: trial by trial, so early trials of every setting
    finish first and an interrupted sweep already has comparable rows."""
    settings = expand(config)
    return [Task(s, t) for t in range(config.trials) for s in settings]


def derive_seed(seed: int, trial: int, stream: int) -> int:
    """A 63-bit seed for (sweep seed, trial, stream) from numpy's SeedSequence (module doc)."""
    import numpy as np

    words = np.random.SeedSequence([seed, trial, stream]).generate_state(2, dtype=np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & ((1 << 63) - 1)


def memory_seed(seed: int, trial: int) -> int:
    """The seed that draws trial `trial`'s memories (stream 0)."""
    return derive_seed(seed, trial, 0)


def run_seed(seed: int, trial: int) -> int:
    """The seed of trial `trial`'s evaluations (stream 1)."""
    return derive_seed(seed, trial, 1)
