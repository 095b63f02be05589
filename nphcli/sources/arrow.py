"""Parquet and Arrow tables (`nph store table.parquet`, `.arrow`, `.feather`: `tables.py` says
what they hold) read a record batch at a time: the embeddings straight into a float32 tensor, never
Python lists; the ids, texts and meta they carry bounded like a text input (`core/bounded.py`)."""

from __future__ import annotations

import datetime
import decimal
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nphcli.core import bounded
from nphcli.core.bounded import LINE_COST
from nphcli.core.errors import NphError
from nphcli.core.resources import check_allocation, human_bytes

if TYPE_CHECKING:
    from torch import Tensor

FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32
BATCH_ROWS = 4096  # rows of a Parquet table read at a time


def arrow_batches(spec: str, columns: list[str] | None = None) -> Iterator[Any]:
    """The record batches of a Parquet or Arrow (IPC file, Feather 2) table, one at a time."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise NphError(f"reading {spec} needs pyarrow: pip install pyarrow") from None
    try:
        if spec.lower().endswith(".parquet"):
            # Streamed a page at a time: a row group (often the whole file) is never held whole.
            table = pyarrow.parquet.ParquetFile(spec, buffer_size=1 << 20, pre_buffer=False)
            yield from table.iter_batches(batch_size=BATCH_ROWS, columns=columns)
            return
        with pyarrow.memory_map(spec) as source:
            reader = pyarrow.ipc.open_file(source)
            for number in range(reader.num_record_batches):
                batch = reader.get_batch(number)
                yield batch if columns is None else batch.select(columns)
    except (OSError, ValueError) as error:  # pyarrow.ArrowInvalid is a ValueError
        raise NphError(f"cannot read {spec} as a table ({str(error).splitlines()[0]})") from None


def read_arrow(spec: str) -> tuple[list[dict[str, Any]], Tensor | None]:
    """A Parquet or Arrow table read a record batch at a time: its items (id, text, meta,
    embedder) and its embeddings, each batch's straight into a float32 tensor (M, d) (None
    without an `embedding` column). The items may take `text_input_limit()` bytes in RAM."""
    import torch

    names = next(arrow_batches(spec), None)
    names = [] if names is None else names.schema.names
    if not ({"embedding", "text"} & set(names)):
        raise NphError(
            f"{spec} has columns {', '.join(names)}; nph reads `id` and `embedding` "
            "(or `text`, embedded with --embed), and `text` if present"
        )
    keep = [name for name in ("id", "text", "meta", "embedder") if name in names]
    rows: list[dict[str, Any]] = []
    blocks: list[Tensor] = []
    cost, limit = 0, bounded.text_input_limit()
    for batch in arrow_batches(spec, keep + ["embedding"] * ("embedding" in names)):
        items = batch.select(keep).to_pylist()
        cost += batch.select(keep).nbytes + LINE_COST * len(items)
        if cost > limit:
            raise NphError(
                f"{spec}: its ids, texts and meta take more than the {human_bytes(limit)} nph "
                "reads of a table (docs/errors.md); store it in parts"
            )
        for row in items:
            if row.get("meta") is not None:
                row["meta"] = _json_meta(row["meta"], spec)
        if "embedding" in names:
            block = _arrow_vectors(spec, batch["embedding"], rows, items, blocks)
            blocks += [block] if block is not None else []
        rows += items
    return rows, (torch.cat(blocks) if blocks else None)


def _arrow_vectors(spec, column, rows, items, blocks) -> Tensor | None:
    """One batch's `embedding` column as float32 (B, d), after the batches `blocks` of the
    `rows` before it; None for a batch of texts only. Refuses what `_vectors` refuses."""
    import numpy as np
    import pyarrow
    import pyarrow.compute
    import torch

    def where(index: int) -> str:
        return f"{spec}: row {len(rows) + index + 1} (id {items[index].get('id')!r})"

    present = column.is_valid().to_numpy(zero_copy_only=False)  # (B,) bool
    if not len(present):
        return None
    first = bool(blocks) if rows else bool(present[0])  # whether the table's first row has one
    differs = np.flatnonzero(present != first)
    if len(differs):
        other = "no embedding while others have one" if first else "an embedding, rows before none"
        raise NphError(
            f"{where(int(differs[0]))} has {other}; give every row an embedding, or none and "
            "--embed MODEL"
        )
    if not first:
        return None
    types, kind = pyarrow.types, column.type
    listed = types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind)
    values = column.flatten() if listed else None
    numeric = values is not None and not values.null_count
    if not (numeric and (types.is_integer(values.type) or types.is_floating(values.type))):
        raise NphError(f"{where(0)}: embedding is not a list of numbers")
    lengths = pyarrow.compute.list_value_length(column).to_numpy(zero_copy_only=False)
    dim = blocks[0].shape[1] if blocks else int(lengths[0])
    wrong = np.flatnonzero((lengths != dim) | (lengths == 0))
    if len(wrong):
        index = int(wrong[0])
        if lengths[index] == 0:
            raise NphError(f"{where(index)}: embedding is not a list of numbers")
        raise NphError(
            f"{where(index)} has {lengths[index]} values, the first row {dim}: every "
            "embedding needs the same dimension"
        )
    array = values.to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~(np.abs(array) <= FLOAT32_MAX))  # NaN compares False too
    if len(bad):
        problem = number_problem(array[int(bad[0])].item())
        raise NphError(f"{where(int(bad[0]) // dim)} has {problem} in its embedding")
    shape = (len(rows) + len(items), dim)
    check_allocation(shape, 4, what=f"{spec}'s embeddings", reduce="store it in parts")
    return torch.from_numpy(array.astype(np.float32)).reshape(len(items), dim)  # (B, d)


def _json_meta(value: Any, spec: str) -> Any:
    """An Arrow `meta` value as JSON keeps it: dates and times as ISO text, decimals as their
    exact digits; bytes are refused (the sidecar holds text)."""
    if isinstance(value, dict):
        return {str(key): _json_meta(item, spec) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_meta(item, spec) for item in value]
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise NphError(f"{spec}: a meta value is binary; store it as text (e.g. hex or base64)")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return value


def number_problem(value: Any) -> str | None:
    """What keeps `value` from being one float32 entry, or None. Python compares an int of any
    length with a float exactly, so a 400-digit integer is measured, not converted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"a non-numeric value {str(value)[:40]!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return "a NaN or infinite value"
    if abs(value) > FLOAT32_MAX:
        return f"a value beyond float32's range (±{FLOAT32_MAX:.3g})"
    return None
