"""How a retrieval run uses an index (`nph retrieve --index`). Torch-free: the CLI builds it."""

from __future__ import annotations

from dataclasses import dataclass

from nphcli.core.errors import NphError
from nphcli.schema.holders import holds


@dataclass(frozen=True)
@holds("index")
class IndexSettings:
    """An index file and its search parameters: one attribute per index field
    (`nphcli.schema.fields`), defaults and ranges from there."""

    path: str  # index file written by `nph index` (the field `index`)
    nprobe: int | None  # IVF lists searched per query; None: the search default
    ef: int | None  # HNSW search breadth; None: the search default
    candidates: int | None  # candidates per query; None: max(model's need, the default)
    check_exact: int  # sampled queries compared with exact retrieval

    def __post_init__(self) -> None:
        if self.path is None:
            raise NphError("an index needs its file: --index PATH")
        if self.nprobe is not None and self.ef is not None:
            raise NphError("choose one of --nprobe (ivf, ivfpq) and --ef (hnsw)")
