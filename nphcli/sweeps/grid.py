"""The sweep grid: its settings, the (setting, trial) tasks in run order, and their seeds.

For each memory size M, each combination of the values of the retrieval fields given (in their
declared order: mask before noise), then of the model parameters given for every model, and
each model with each combination of its own [[models]] values (the last varies fastest). A model
that does not take a parameter, or sets it in its own table, has one value on that parameter's
axis. Each setting is one `RetrieveSettings` (`settings_from`, as `nph retrieve` builds it) and
runs once per trial, with the trial's seeds (docs/sweeps.md, "Seeds").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nphcli.core.errors import NphError

if TYPE_CHECKING:  # the grid reads a config; the config checks its models through the grid
    from nphcli.sweeps.config import SweepConfig

# The settings with their own place in a setting's key (so never in its label), by option name,
# each with the title of its column in the sweep's summary (after M).
KEYED = {"mask": "mask", "noise": "noise σ", "beta": "β"}


@dataclass(frozen=True)
class Setting:
    """One point of the grid (everything but the trial)."""

    settings: Any  # RetrieveSettings of the run; its seed is the sweep's (`run_seed` per trial)
    size: int  # memory size M
    shown: tuple[tuple[str, Any], ...]  # the model parameters given and the fields that vary

    @property
    def model(self) -> str:
        return self.settings.model

    @property
    def params(self) -> tuple[tuple[str, Any], ...]:
        """The model parameters given for this setting (β apart)."""
        return tuple((k, v) for k, v in self.shown if k in self.settings.params)

    @property
    def axes(self) -> dict[str, Any]:
        """M and the KEYED settings' values, by name (β None: the model takes none)."""
        from nphcli.evaluation.settings import setting_values

        values = {**setting_values(self.settings), **self.settings.params}
        return {"M": self.size, **{name: values.get(name) for name in KEYED}}

    @property
    def label(self) -> str:
        """The model setting, e.g. `topk k=0.2`: one line of a plot."""
        return " ".join([self.model, *(f"{k}={_text(v)}" for k, v in self.shown)])

    @property
    def key(self) -> str:
        """The setting's identity in a results file (with the trial, a row's key)."""
        a, mode = self.axes, self.settings.corruption.mask_mode or "default"
        beta = "" if a["beta"] is None else f" | beta={_text(a['beta'])}"
        return (
            f"{self.label} | M={self.size} | mask={_text(a['mask'])} {mode} | "
            f"noise={_text(a['noise'])}{beta}"
        )


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def expand(config: SweepConfig) -> list[Setting]:
    """The grid's settings in run order (module docstring)."""
    from nphcli.evaluation.settings import settings_from
    from nphcli.schema.catalog import get_card
    from nphcli.schema.fields import fields

    declared = [f.name for f in fields() if f.name in config.values]
    params = [name for name in config.values if name not in declared]
    axes = [(name, config.values[name]) for name in (*declared, *params)]
    varying = [name for name in declared if len(config.values[name]) > 1 and name not in KEYED]
    settings = []
    for size in config.sizes:
        for picks in itertools.product(*(range(len(values)) for _, values in axes)):
            chosen = {name: values[i] for (name, values), i in zip(axes, picks, strict=True)}
            at = dict(zip((name for name, _ in axes), picks, strict=True))
            fixed = {name: chosen[name] for name in declared}
            fixed["seed"] = config.seed
            for spec in config.models:
                card = get_card(spec.name)
                own = [n for n in params if card.takes(n) and n not in spec.grid]
                if any(at[n] for n in params if n not in own):
                    continue  # an axis the model does not take: its first value stands for all
                for table in spec.settings():
                    given = {**{n: chosen[n] for n in own}, **table}
                    if card.takes("beta"):  # the key names β: a run states it
                        beta = next(p.default for p in card.params if p.name == "beta")
                        given.setdefault("beta", beta)
                    shown = [(n, v) for n, v in given.items() if n != "beta"]
                    shown += [(n, chosen[n]) for n in varying]
                    run = settings_from(spec.name, given, fixed)
                    settings.append(Setting(run, size, tuple(shown)))
    keys = [s.key for s in settings]
    if len(set(keys)) != len(keys):
        duplicate = next(k for k in keys if keys.count(k) > 1)
        raise NphError(f"the grid lists one setting twice ({duplicate}); remove the repeat")
    return settings


def distinct_models(config: SweepConfig) -> list[Any]:
    """One `RetrieveSettings` per distinct model and parameters of the grid (to build each
    model once for its checks)."""
    found: dict[str, Any] = {}
    for setting in expand(config):
        run = setting.settings
        found.setdefault(f"{run.model} {sorted(run.params.items())!r}", run)
    return list(found.values())


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
