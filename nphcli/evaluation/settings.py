"""What decides one retrieval run (`RetrieveSettings`), checked when it is made, and the model it
builds. The library's own types only: text from the command line is parsed in `nphcli.cli`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nphcli.ann.settings import IndexSettings
from nphcli.errors import NphError
from nphcli.evaluation.corruption import Corruption


@dataclass
class RetrieveSettings:
    """Everything that decides a retrieval run, apart from the memory and own queries."""

    model: str = "dense"  # a registered model name (`nph models`)
    params: dict[str, Any] = field(default_factory=dict)  # model parameters; None = its default
    corruption: Corruption = field(default_factory=Corruption)  # applied to every query
    queries: int | None = None  # how many queries to draw with the seed; None: all of them
    seed: int = 0  # query choice, corruption, and the model's `seed` if it takes one
    device: str = "cpu"  # cpu, cuda, cuda:N, mps or auto
    dtype: str = "float32"  # dtype of memories and queries during retrieval
    batch_size: int | None = None  # queries per model call; None: all (the model bounds memory)
    repeat: int = 1  # how many times the timed retrieval runs (min and median are reported)
    memory_budget: int | None = None  # bytes of model working memory; None: the engine default
    index: IndexSettings | None = None  # retrieve over an approximate index (`nph index`)
    tf32: bool = False  # float32 matrix products on TF32 tensor cores (CUDA); changes results

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise NphError(f"--seed must be a whole number ≥ 0, got {self.seed!r}")
        budget = self.memory_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
            raise NphError(f"--memory-budget must be a whole number of bytes, got {budget!r}")
        if budget is not None and budget < 1:
            raise NphError(f"--memory-budget must be positive, got {budget!r}")
        for flag, value in (
            ("--queries", self.queries),
            ("--batch-size", self.batch_size),
            ("--repeat", self.repeat),
        ):
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise NphError(f"{flag} must be a whole number ≥ 1, got {value!r}")


def build_model(settings: RetrieveSettings):
    """The model of `settings`: its own defaults for parameters not given, and the run's seed
    for models that take a `seed`, so one --seed reproduces the whole run."""
    from nphcli.models import create_model, get_model_info

    params = dict(settings.params)
    takes = {p.name for p in get_model_info(settings.model).params}
    if "seed" in takes and params.get("seed") is None:
        params["seed"] = settings.seed
    return create_model(settings.model, **params)
