"""Embedding tables and texts (docs/text.md): rows that carry an id (and a text) beside their
vector. `.jsonl`: one object a line, `{"id", "embedding", "text", "meta"}`; `.txt`: one text a
line (the id is its line number); `.parquet`, `.arrow`, `.feather`: columns `id`, `embedding`,
`text` (`arrow.py`). Rows without `embedding` need a `text` and `--embed MODEL`. The items go to
the memory's sidecar (`nphcli.memory.items`), the embedder's record to its metadata, so that text
queries use the same one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from nphcli.core.bounded import MAX_TEXT_CHARS, cut_texts, read_lines
from nphcli.core.defaults import ITEM_RECALL
from nphcli.core.errors import NphError
from nphcli.core.jsontext import parse_json
from nphcli.core.notices import notice
from nphcli.memory.items import check_items
from nphcli.sources.arrow import arrow_batches, number_problem, read_arrow
from nphcli.sources.base import VECTOR, Loaded, SourceOptions, choose, file_meta, register_source
from nphcli.sources.embedders import check_same_embedder, resolve_embedder

if TYPE_CHECKING:
    from torch import Tensor


TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet", ".arrow", ".feather")


def holds_embeddings(path: Path) -> bool:
    """Whether a table's first row has an embedding (a .txt never does)."""
    spec, suffix = str(path), path.suffix.lower()
    if suffix == ".txt":
        return False
    if suffix == ".jsonl":
        first = next(((n, line) for n, line in _lines(spec) if line.strip()), None)
        return first is not None and _object(spec, *first).get("embedding") is not None
    first = next(arrow_batches(spec), None)
    return (
        first is not None and "embedding" in first.schema.names and first["embedding"][0].is_valid
    )


def embed_queries(texts: list[str], memory_meta: dict[str, Any], memory_name: str) -> Tensor:
    """Query texts (Q,) as vectors (Q, d), embedded with the embedder the memory records."""
    record = memory_meta.get("embedder")
    if not record:
        raise NphError(
            f"{memory_name} holds vectors stored without an embedder: text queries need a "
            "memory stored from texts (`nph store texts.txt --embed MODEL`)"
        )
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        raise NphError(
            f"{memory_name}: its embedder record is not an object naming a model; store the "
            "memory again"
        )
    embedder = resolve_embedder(record["name"])
    check_same_embedder(record, embedder, memory_name)
    return _readable(embedder.embed(_cut(texts, "queries")), texts, "query text")


def read_query_rows(path: Path, memory_meta: dict[str, Any], what: str) -> Tensor:
    """Own queries from texts or a table: rows with embeddings are taken as they are (a row
    naming an `embedder` must name the memory's), rows of texts are embedded as the memory's."""
    spec = str(path)
    if path.suffix.lower() == ".txt":
        rows = [{"text": line.strip()} for _, line in _lines(spec, texts=True) if line.strip()]
        vectors = None
    elif path.suffix.lower() == ".jsonl":
        rows, vectors = [_object(spec, n, line) for n, line in _lines(spec) if line.strip()], None
    else:
        rows, vectors = read_arrow(spec)
    if not rows:
        raise NphError(f"{what} file {path} holds no rows")
    if vectors is not None or all(row.get("embedding") is not None for row in rows):
        named = {str(row["embedder"]) for row in rows if row.get("embedder") is not None}
        record = memory_meta.get("embedder")
        record = record if isinstance(record, dict) else {}
        if named and named != {record.get("name")}:
            raise NphError(
                f"{what} file {path} was embedded with {', '.join(sorted(map(str, named)))}, "
                f"the memory with {record.get('name', 'no named embedder')}: use the same model"
            )
        if vectors is not None:
            return vectors
        return _vectors(spec, [row["embedding"] for row in rows], rows)
    missing = next((i for i, row in enumerate(rows) if not row.get("text")), None)
    if missing is not None:
        raise NphError(f"{what} file {path}: row {missing + 1} has neither an embedding nor a text")
    return embed_queries([row["text"] for row in rows], memory_meta, what + " memory")


@register_source(
    "jsonl",
    summary="a JSON Lines table: id, embedding (or text with --embed), optional text and meta",
    options=("embed",),
    suffixes=(".jsonl",),
)
def load_jsonl(spec: str, options: SourceOptions) -> Loaded:
    rows = [_object(spec, number, line) for number, line in _lines(spec) if line.strip()]
    return table_source(spec, rows, None, options)


@register_source(
    "txt",
    summary="texts, one per line, embedded with --embed",
    options=("embed",),
    suffixes=(".txt",),
)
def load_txt(spec: str, options: SourceOptions) -> Loaded:
    lines = _lines(spec, texts=True)
    rows = [{"id": number, "text": line.strip()} for number, line in lines if line.strip()]
    return table_source(spec, rows, None, options)


@register_source(
    "parquet",
    summary="a Parquet or Arrow table: id, embedding (or text with --embed), optional text",
    options=("embed",),
    suffixes=(".parquet", ".arrow", ".feather"),
)
def load_arrow(spec: str, options: SourceOptions) -> Loaded:
    return table_source(spec, *read_arrow(spec), options)


def read_ids(path: str | Path, rows: int) -> list[dict[str, Any]]:
    """The items of `rows` .npy rows from `--ids FILE`: one id a line, or .jsonl objects."""
    path = str(path)
    if path.lower().endswith(".jsonl"):
        items = [_object(path, number, line) for number, line in _lines(path) if line.strip()]
        items = [{key: item.get(key) for key in ("id", "text", "meta")} for item in items]
    else:
        items = [{"id": line.strip()} for _, line in _lines(path) if line.strip()]
    check_items(items, rows, f"--ids {path}")
    return items


def table_source(
    spec: str, rows: list[dict[str, Any]], vectors: Tensor | None, options: SourceOptions
) -> Loaded:
    """Rows of a table (each with id, and embedding or text) as raw patterns and items; or
    `vectors` (M, d), the rows' embeddings already read."""
    if not rows:
        raise NphError(f"{spec} holds no rows")
    embedded = [vectors is not None or row.get("embedding") is not None for row in rows]
    if any(embedded) and not all(embedded):
        row = embedded.index(False) if embedded[0] else embedded.index(True)
        raise NphError(
            f"{spec}: row {row + 1} (id {rows[row].get('id')!r}) has no embedding while others "
            "have one; give every row an embedding, or none and --embed MODEL"
        )
    items = [{key: row.get(key) for key in ("id", "text", "meta")} for row in rows]
    check_items(items, len(rows), spec)
    indices, selection = choose(len(rows), options.n, options.seed, what=spec)
    if indices is not None:
        items = [items[int(i)] for i in indices]
        rows = [rows[int(i)] for i in indices]
    meta = file_meta(spec, VECTOR, None, selection["of"], selection, options)
    meta["recall"] = dict(ITEM_RECALL)  # what `nph recall` uses unless told otherwise
    if all(embedded):
        if options.embed is not None:
            raise NphError(f"{spec} holds embeddings already; --embed embeds texts only")
        if vectors is None:
            patterns = _vectors(spec, [row["embedding"] for row in rows], rows)
        else:
            patterns = vectors if indices is None else vectors[indices]
    else:
        patterns, meta["embedder"] = _embedded(spec, items, options)
    return Loaded(patterns, None, meta, items)


def _embedded(spec: str, items: list[dict[str, Any]], options: SourceOptions):
    missing = next((i for i, item in enumerate(items) if not item.get("text")), None)
    if missing is not None:
        raise NphError(f"{spec}: row {missing + 1} has neither an embedding nor a text")
    if options.embed is None:
        raise NphError(
            f"{spec} holds texts without embeddings: give --embed MODEL to embed them (a table "
            "of numbers is read from .csv)"
        )
    embedder = resolve_embedder(options.embed)
    texts = [item["text"] for item in items]
    progress = options.progress
    if progress is not None:
        progress(len(texts))
    step = (lambda done: progress(None)) if progress is not None else None
    vectors = embedder.embed(_cut(texts, spec), step)
    return _readable(vectors, texts, f"{spec}: text"), embedder.record


def _readable(vectors: Tensor, texts: list[str], what: str) -> Tensor:
    """Refuse a text the embedder found nothing in (an empty text, punctuation only): its
    vector would be zero, and a zero query or pattern answers nothing."""
    empty = (vectors.abs().sum(dim=1) == 0).nonzero()  # (k, 1)
    if len(empty):
        row = int(empty[0, 0])
        raise NphError(
            f"{what} {row + 1} ({texts[row][:40]!r}) holds nothing the embedder reads (no "
            "word): it would embed to a zero vector; give a text with words"
        )
    return vectors


def _vectors(spec: str, vectors: list[Any], rows: list[dict[str, Any]]) -> Tensor:
    import torch

    dim = None
    for number, vector in enumerate(vectors):
        row = f"{spec}: row {number + 1} (id {rows[number].get('id')!r})"
        if not isinstance(vector, list) or not vector:
            raise NphError(f"{row}: embedding is not a list of numbers")
        if dim is None:
            dim = len(vector)
        elif len(vector) != dim:
            raise NphError(
                f"{row} has {len(vector)} values, the first row {dim}: every embedding needs the "
                "same dimension"
            )
        for value in vector:
            problem = number_problem(value)
            if problem is not None:
                raise NphError(f"{row} has {problem} in its embedding")
    return torch.tensor(vectors, dtype=torch.float32)  # (M, d)


def _lines(path: str, *, texts: bool = False):
    """(number, line) of a text file within `core/bounded.py`'s bounds (a long text line cut)."""
    return read_lines(path, what="file", truncate=texts)


def _cut(texts: list[str], where: str) -> list[str]:
    """Texts cut to the length an embedder reads, with a note when one was."""
    texts, cut = cut_texts(texts)
    if cut:
        notice(
            f"{where}: {cut} text(s) longer than {MAX_TEXT_CHARS:,} characters were embedded "
            "from their start only, as a model's tokenizer keeps its first tokens"
        )
    return texts


def _object(path: str, number: int, line: str) -> dict[str, Any]:
    value = parse_json(line, what=f"{path}: line {number}")  # bounded, as every outside JSON
    if not isinstance(value, dict):
        raise NphError(f"{path}: line {number} is not a JSON object")
    return value
