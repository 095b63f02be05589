"""What one retrieval run reports (`RetrievalReport`) and the shapes it takes outside Python: the
JSON object of `nph retrieve --json`, flat CSV rows, and a safetensors file of results.

The names here are the public schema: scripts read these keys, so they change only on purpose.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from nphcli.core.atomic import atomic_write
from nphcli.core.dtypes import dtype_name
from nphcli.core.errors import NphError
from nphcli.memory.bank import MemoryBank
from nphcli.memory.provenance import provenance
from nphcli.schema.metrics import METRIC_NAMES
from nphcli.schema.settings import Corruption, RetrieveSettings
from nphcli.version import __version__

if TYPE_CHECKING:
    from nphcli.evaluation.corruption import Corrupted
    from nphcli.evaluation.queries import Selection

METRICS = METRIC_NAMES  # the per-query metrics, in output order (`nphcli.schema.metrics`)
STATS = ("mean", "std", "median")
TIMINGS = (
    "load_s",
    "corrupt_s",
    "transfer_s",
    "warmup_s",
    "retrieve_min_s",
    "retrieve_median_s",
    "metrics_s",
    "total_s",
    "queries_per_s",
    "us_per_query",
)
PER_QUERY = (
    "query_row",
    "target_index",
    "nearest",
    "nearest_distance",
    "success",
    "sse",
    "mse",
    "cosine",
    "support",
    "steps",
    "pixel_success",
    "attractor",
    "attractor_size",
    "energy",
)


@dataclass
class RetrievalReport:
    """What one run measured. Tensors are on the CPU; per-query tensors have shape (Q,)."""

    config: dict[str, Any]  # model, params, seed, device, dtype, memory, queries, corruption
    metrics: dict[str, dict[str, float] | None]  # metric → {mean, std, median}, None if n/a
    timing: dict[str, float]  # see TIMINGS and `nphcli.evaluation.evaluate`
    per_query: dict[str, Tensor]  # see PER_QUERY; only the metrics that apply
    retrieved: Tensor  # (Q, d_v) T(x), in the retrieval dtype
    queries: Tensor  # (Q, d) the corrupted queries, float32 (float64 for float64 memories)
    targets: Tensor | None  # (Q, d_v) uncorrupted targets, when known
    recall: list[dict[str, Any]] | None = None  # what each query recalled (`evaluation.recall`)

    def to_json(self, *, per_query: bool = False) -> dict[str, Any]:
        """The JSON object `nph retrieve --json` prints."""
        out: dict[str, Any] = {
            "config": self.config,
            "metrics": self.metrics,
            "timing": self.timing,
        }
        if per_query:
            out["per_query"] = {
                key: _per_query_list(key, value)
                for key, value in self.per_query.items()
                if not key.startswith("at_")  # the kinds' shares: `attractor` says it per query
            }
        if self.recall is not None:
            out["recall"] = self.recall
        return out

    def to_row(self) -> dict[str, Any]:
        """One flat CSV row. The columns are the same for every model (parameters a model does
        not take are empty), so rows of different runs can be appended to one file."""
        config = self.config
        row: dict[str, Any] = {"model": config["model"]}
        for name in param_columns():
            row[name] = config["params"].get(name, "")
        row.update(
            {
                "run_seed": config["seed"],
                "device": config["device"],
                "dtype": config["dtype"],
                "memory": config["memory"]["file"] or "",
                **provenance_columns(config),
                "M": config["memory"]["M"],
                "d": config["memory"]["d"],
                "Q": config["queries"]["Q"],
                "queries": config["queries"]["source"],
                # Corruption's declared order, unset ones at their default: every row of a
                # sweep has the same columns whichever corruptions it sets.
                **{
                    field.name: config["corruption"].get(field.name, field.default)
                    for field in dataclasses.fields(Corruption)
                },
                "batch_size": config["batch_size"],
                "repeat": config["repeat"],
            }
        )
        for metric in METRICS:
            stats = self.metrics.get(metric) or {}
            for stat in STATS:
                row[f"{metric}_{stat}"] = csv_value(stats.get(stat))
        for key in TIMINGS:
            row[key] = csv_value(self.timing.get(key))
        return row

    def per_query_rows(self) -> list[dict[str, Any]]:
        """One flat row per query (for `--per-query --csv`); empty cells where n/a."""
        lists = {
            key: _per_query_list(key, self.per_query[key])
            for key in PER_QUERY
            if key in self.per_query
        }
        count = len(lists["query_row"])
        return [
            {"query": i, **{key: (lists[key][i] if key in lists else "") for key in PER_QUERY}}
            for i in range(count)
        ]


def provenance_columns(config: dict[str, Any]) -> dict[str, Any]:
    """What a flat results row records of where it came from, from a report's `config`: the
    memory's content hash, resolved path, normalisation and shape, nph's version and the
    run-wide settings. The one place retrieve, batch and sweep rows (and `nph plot` and
    `nph report` reading JSON) get these columns from."""
    memory = config["memory"]
    shape = [memory["M"], memory["d"]] + ([memory["d_v"]] if memory.get("hetero") else [])
    return {
        # readable columns first: a plot names a line by the first columns that tell it apart
        "memory_normalize": memory.get("normalize") or "",
        "memory_shape": "x".join(str(n) for n in shape),
        "memory_sha256": memory.get("sha256") or "",
        "memory_path": memory.get("path") or "",
        "stream": memory.get("stream", False),
        "tf32": config.get("tf32", False),
        "memory_budget": config.get("memory_budget", ""),
        "nph_version": config.get("nph_version", ""),
    }


def _per_query_list(key: str, value: Tensor) -> list[Any]:
    """A per-query tensor as a list; the attractor codes as the kinds' names."""
    if key == "attractor":
        from nphcli.evaluation.attractors import ATTRACTOR_KINDS

        return [ATTRACTOR_KINDS[code] for code in value.tolist()]
    return value.tolist()


def param_columns() -> list[str]:
    """Every parameter name any registered model takes, in registry order (the CSV columns)."""
    from nphcli.models import list_models

    return list(dict.fromkeys(p.name for info in list_models() for p in info.params))


def csv_value(value: Any) -> Any:
    """A CSV cell: empty for a missing or non-finite number."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return value


RESULT_FORMATS = (".safetensors", ".npz")


def check_results_output(path: str | os.PathLike) -> str:
    """The results format `path`'s extension names (before any work); NphError for others."""
    suffix = Path(path).suffix.lower()
    if suffix not in RESULT_FORMATS:
        raise NphError(f"cannot tell the results format of {path}: name it .safetensors or .npz")
    return suffix


def save_results(path: str | os.PathLike, report: RetrievalReport, *, force: bool = False) -> Path:
    """Write `retrieved` (Q, d_v), `nearest` (Q,), `queries` (Q, d), `query_row` (Q,) and, when
    known, `target_index` (Q,) atomically, as the extension of `path` says: a safetensors file
    with the config as JSON in its metadata under "config", or a NumPy .npz with the config as
    a JSON string array `config` (bfloat16 tensors become float32: NumPy has no bfloat16)."""
    suffix = check_results_output(path)

    tensors = {
        "retrieved": report.retrieved,
        "nearest": report.per_query["nearest"],
        "queries": report.queries,
        "query_row": report.per_query["query_row"],
    }
    if "target_index" in report.per_query:
        tensors["target_index"] = report.per_query["target_index"]
    tensors = {key: value.contiguous() for key, value in tensors.items()}
    if suffix == ".npz":
        import numpy as np

        arrays = {
            key: (value.float() if value.dtype == torch.bfloat16 else value).numpy()
            for key, value in tensors.items()
        }
        arrays["config"] = np.array(json.dumps(report.config))
        with atomic_write(path, force=force) as tmp, open(tmp, "wb") as handle:
            np.savez(handle, **arrays)  # a handle: savez would add .npz to a name
        return Path(path)
    from safetensors.torch import save_file

    meta = {"format": "nph-retrieval", "config": json.dumps(report.config)}
    with atomic_write(path, force=force) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return Path(path)


def run_config(
    model,
    settings: RetrieveSettings,
    memory: MemoryBank,
    chosen: Selection,
    corrupted: Corrupted,
    sources: dict[str, str | None],
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """The report's `config`: everything needed to repeat the run (`evaluate`'s)."""
    item_shape = memory.item_shape
    from nphcli.models import get_model_info

    origin = provenance(memory)
    return {
        "model": settings.model,
        "params": {p.name: getattr(model, p.name) for p in get_model_info(settings.model).params},
        "seed": settings.seed,
        "device": str(device),
        "dtype": dtype_name(dtype),
        "tf32": settings.tf32,
        "memory": {
            "file": sources.get("memory"),
            "M": memory.num_memories,
            "d": memory.dim,
            "d_v": memory.value_dim,
            "hetero": memory.hetero,
            "item_shape": list(item_shape) if item_shape else None,
            "stream": memory.resident() is None,
            "sha256": origin["sha256"],
            "path": origin["path"],
            "normalize": origin["normalize"],
        },
        "queries": {
            "source": chosen.query_source,
            "file": sources.get("queries"),
            "Q": chosen.rows.shape[0],
            "targets": chosen.target_source,
            "targets_file": sources.get("targets"),
        },
        "corruption": _corruption_config(settings.corruption, corrupted.mask_mode),
        "batch_size": None,
        "repeat": settings.repeat,
        "memory_budget": settings.budget,
        "nph_version": __version__,
    }


def _corruption_config(corruption: Corruption, mask_mode: str) -> dict[str, Any]:
    """The report's corruption record, every corruption field's value; `noise_clip`, `occlude`,
    `salt_pepper` and `flip` appear only when set, so runs without them report exactly what they
    did before the options existed."""
    out = {**dataclasses.asdict(corruption), "mask_mode": mask_mode}
    for optional in ("noise_clip", "occlude", "salt_pepper", "flip"):
        if not out[optional]:
            del out[optional]
    return out
