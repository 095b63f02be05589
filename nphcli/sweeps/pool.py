"""The pattern pool of a sweep (its source, loaded and normalised once) and the memories drawn
from it (nested within a trial: docs/sweeps.md, "Seeds")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.sweeps.config import SweepConfig


@dataclass
class Pool:
    """The patterns memories are drawn from: the whole source, normalised once."""

    patterns: Any  # (N, d) Tensor
    labels: Any  # (N,) Tensor or None
    meta: dict[str, Any]
    spec: str  # the dataset name or file it came from
    digest: str | None = None  # its content hash, once computed (`content_sha256`)

    @property
    def size(self) -> int:
        """N, the number of patterns a memory can be drawn from."""
        return int(self.patterns.shape[0])

    def content_sha256(self) -> str:
        """The pool's content hash (`nphcli.memory.provenance`), computed once."""
        if self.digest is None:
            from nphcli.memory.provenance import tensors_digest

            tensors = {"patterns": self.patterns}
            if self.labels is not None:
                tensors["labels"] = self.labels
            self.digest = tensors_digest(tensors)
        return self.digest

    @property
    def normalize(self) -> str:
        """The normalisation applied (a results column: a resumed file must match it)."""
        record = self.meta.get("normalize") or {}
        return record.get("method", "none")


def load_pool(config: SweepConfig) -> Pool:
    """Load and normalise the sweep's source once (`nph store`'s loaders: datasets fall back to
    the bundled real samples offline, with a notice)."""
    from nphcli.sources import SourceOptions, prepare_memory

    options = SourceOptions(root=Path(config.root) if config.root else None)
    prepared = prepare_memory(config.dataset, options, normalize=config.normalize)
    return Pool(prepared.patterns, prepared.labels, prepared.meta, config.dataset)


def check_pool(config: SweepConfig, pool: Pool) -> None:
    """Refuse sizes the pool cannot fill, and parameters that do not fit a size, before work."""
    largest = max(config.sizes)
    if largest > pool.size:
        origin = " (the offline fallback sample)" if pool.meta.get("fallback") else ""
        raise NphError(
            f"memory size {largest} exceeds the {pool.size} patterns of {pool.spec}{origin}; "
            f"use sizes ≤ {pool.size}, or give the full dataset (--root, $NPH_DATA; "
            "`nph store --download` fetches it)"
        )
    from nphcli.evaluation.settings import build_model
    from nphcli.memory.bank import TensorBank
    from nphcli.sweeps.grid import distinct_models

    for settings in distinct_models(config):
        model = build_model(settings)
        for size in config.sizes:
            model.check_memory(TensorBank(pool.patterns[:size]))  # the shape of every draw


def draw_memory(pool: Pool, size: int, seed: int) -> Any:
    """A `Memory` of `size` patterns: the first `size` of a seeded permutation of the pool, kept
    in pool order."""
    import torch

    from nphcli.memory.file import Memory

    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(pool.size, generator=generator)[:size].sort().values  # (M,)
    labels = None if pool.labels is None else pool.labels[rows]
    meta = {**pool.meta, "selection": {"method": "random_subset", "n": size, "of": pool.size}}
    return Memory(patterns=pool.patterns[rows], labels=labels, meta=meta)
