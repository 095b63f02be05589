"""How a retrieval run uses an index (`nph retrieve --index`). Torch-free: the CLI builds it."""

from __future__ import annotations

from dataclasses import dataclass

from nphcli.core.errors import NphError

DEFAULT_CHECK_EXACT = 100  # queries compared with exact retrieval unless --check-exact says


@dataclass(frozen=True)
class IndexSettings:
    """An index file and its search parameters."""

    path: str  # index file written by `nph index`
    nprobe: int | None = None  # IVF lists searched per query; None: the search default
    ef: int | None = None  # HNSW search breadth; None: the search default
    candidates: int | None = None  # candidates per query; None: max(model's need, 64)
    check_exact: int = DEFAULT_CHECK_EXACT  # sampled queries compared with exact retrieval

    def __post_init__(self) -> None:
        for flag, value in (
            ("--nprobe", self.nprobe),
            ("--ef", self.ef),
            ("--candidates", self.candidates),
        ):
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise NphError(f"{flag} must be a whole number ≥ 1, got {value!r}")
        if self.nprobe is not None and self.ef is not None:
            raise NphError("choose one of --nprobe (ivf, ivfpq) and --ef (hnsw)")
        value = self.check_exact
        if isinstance(value, bool) or int(value) != value or value < 0:
            raise NphError(f"--check-exact must be a whole number ≥ 0, got {value!r}")
