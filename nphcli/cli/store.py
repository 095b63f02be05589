"""`nph store SOURCE`: put a dataset, synthetic patterns or a file into a memory file."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.options import Force, JsonOutput, Seed
from nphcli.cli.render import format_value, print_json, print_table
from nphcli.core.dtypes import STORE_DTYPES
from nphcli.core.normalize import METHODS
from nphcli.sources import list_sources
from nphcli.sources.synthetic import DISTRIBUTIONS

DEFAULT_OUT = Path("memory.safetensors")
Split = enum.Enum("Split", {name: name for name in ("train", "test")}, type=str)
Normalize = enum.Enum("Normalize", {name: name for name in METHODS}, type=str)
Dtype = enum.Enum("Dtype", {name: name for name in STORE_DTYPES}, type=str)
Distribution = enum.Enum("Distribution", {name: name for name in DISTRIBUTIONS}, type=str)


def _help() -> str:
    named = [s for s in list_sources() if not s.suffixes and s.name != "folder"]
    files = [s for s in list_sources() if s.suffixes or s.name == "folder"]
    lines = [
        "Store patterns in a memory file (safetensors) for `nph retrieve` and `nph info`.",
        "",
        "SOURCE is a name or a path:",
        "",
        "\b",
        *(f"  {s.name:<14} {s.summary}" for s in named),
        *(f"  {'/'.join(s.suffixes) or 'FOLDER':<14} {s.summary}" for s in files),
        "",
        "Datasets are read from --root, else $NPH_DATA, else ~/.cache/nph; nothing is "
        "downloaded without --download. A dataset that is not on disk falls back to real data "
        "nph can reach offline (see the README); a note on stderr and the file's metadata say "
        "so.",
    ]
    return "\n".join(lines)


def _normalize_help() -> str:
    methods = "; ".join(f"{name}: {text}" for name, text in METHODS.items())
    return (
        "How values are scaled. r: raw values (pixel intensities 0..255 for images, numbers as "
        "read otherwise); lo, hi: 0, 255 for images, else the data's min and max. "
        f"{methods}. Default: unit for images, none otherwise."
    )


@app.command("store", help=_help())
def store_command(
    source: Annotated[
        str,
        typer.Argument(
            help="mnist, fashion-mnist, cifar10, random, a file, or a folder of images."
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Memory file to write (.safetensors).")
    ] = DEFAULT_OUT,
    values: Annotated[
        Path | None,
        typer.Option(
            "--values",
            help="Hetero-association: a file of values (M, d_v), row i belonging to row i of "
            "SOURCE before --n (any file format SOURCE may be); retrieval then returns values.",
        ),
    ] = None,
    labels: Annotated[
        Path | None,
        typer.Option(
            "--labels",
            help="Integer labels, one per row of SOURCE before --n: .npy, or .csv/.txt with one "
            "number per line. Replaces a dataset's own labels.",
        ),
    ] = None,
    n: Annotated[
        int | None,
        typer.Option(
            "--n",
            help="Keep a random subset of N patterns (without replacement, chosen with --seed); "
            "for `random`, how many patterns to draw (default 1000). Default: all.",
        ),
    ] = None,
    seed: Seed = 0,
    split: Annotated[
        Split | None,
        typer.Option("--split", help="Dataset split to read (datasets only). Default: train."),
    ] = None,
    root: Annotated[
        Path | None,
        typer.Option(
            "--root",
            help="Dataset root folder, laid out as torchvision expects (MNIST/raw/, "
            "FashionMNIST/raw/, cifar-10-batches-py/). Default: $NPH_DATA, else ~/.cache/nph.",
        ),
    ] = None,
    download: Annotated[
        bool,
        typer.Option(
            "--download", help="Let torchvision download a dataset missing from the root."
        ),
    ] = False,
    normalize: Annotated[
        Normalize | None, typer.Option("--normalize", help=_normalize_help())
    ] = None,
    dtype: Annotated[
        Dtype, typer.Option("--dtype", help="Storage dtype of the patterns.")
    ] = Dtype.float32,
    key: Annotated[
        str | None,
        typer.Option(
            "--key", help="Array to read from a .npz, .safetensors or .pt file with several."
        ),
    ] = None,
    size: Annotated[
        str | None,
        typer.Option("--size", help="Resize every image of a folder to WxH pixels, e.g. 28x28."),
    ] = None,
    dim: Annotated[
        int | None, typer.Option("--dim", help="Values per pattern for `random` (default 64).")
    ] = None,
    distribution: Annotated[
        Distribution | None,
        typer.Option(
            "--distribution",
            help="Entries of `random` patterns: gaussian, N(0, 1) (default); binary, ±1 with "
            "probability 1/2 each.",
        ),
    ] = None,
    parts: Annotated[
        int | None,
        typer.Option(
            "--parts",
            help="Also split the memory into N shards and a manifest beside --out, as "
            "`nph shard` does (docs/distributed.md).",
        ),
    ] = None,
    force: Force = False,
    as_json: JsonOutput = False,
) -> None:
    from nphcli.app.store import store_memory

    stored = store_memory(
        source,
        out,
        values=values,
        labels=labels,
        normalize=normalize and normalize.value,
        dtype=dtype.value,
        parts=parts,
        force=force,
        n=n,
        seed=seed,
        split=split and split.value,
        root=root,
        download=download,
        key=key,
        size=size,
        dim=dim,
        distribution=distribution and distribution.value,
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
    rows = [
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
        ("dtype", meta.get("dtype", "?")),
        ("size", f"{size_bytes:,} bytes"),
    ]
    return rows
