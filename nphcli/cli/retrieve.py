"""`nph retrieve`: corrupt stored patterns (or read your own queries), retrieve, measure, report.

Parsing and rendering only; `nphcli.evaluation.evaluate` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.model_options import parse_single, with_model_options
from nphcli.cli.parsing import parse_indices, parse_size
from nphcli.cli.render import format_value, print_csv, print_json, print_table


@app.command("retrieve")
@with_model_options
def retrieve_command(
    memory: Annotated[
        Path, typer.Option("--memory", help="Memory file written by `nph store`.")
    ] = Path("memory.safetensors"),
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="Retrieval model; `nph models` lists them with their parameters, which are "
            "the options below that name the models taking them.",
        ),
    ] = "dense",
    seed: Annotated[
        int,
        typer.Option(
            "--seed", help="Seed of query choice, corruption and the model's own randomness."
        ),
    ] = 0,
    queries: Annotated[
        int | None,
        typer.Option("--queries", help="Use N queries drawn with the seed [default: all]."),
    ] = None,
    queries_file: Annotated[
        Path | None,
        typer.Option(
            "--queries-file",
            help="Own queries, one per row: any file `nph store` reads (.npy, .npz, .csv, "
            ".safetensors, .pt, a folder of images).",
        ),
    ] = None,
    targets_file: Annotated[
        Path | None,
        typer.Option("--targets-file", help="Targets for own queries, one row per query (Q, d_v)."),
    ] = None,
    target_indices: Annotated[
        str | None,
        typer.Option(
            "--target-indices", help="Stored row of each own query's target, e.g. 3,17,42."
        ),
    ] = None,
    mask: Annotated[
        float, typer.Option("--mask", help="Fraction of each query to hide, in [0, 1].")
    ] = 0.0,
    mask_mode: Annotated[
        str | None,
        typer.Option(
            "--mask-mode",
            help="bottom, top, left, right (images) or random [default: bottom for images, "
            "random for vectors].",
        ),
    ] = None,
    fill: Annotated[float, typer.Option("--fill", help="Value written into hidden entries.")] = 0.0,
    noise: Annotated[
        float,
        typer.Option("--noise", help="Gaussian noise standard deviation σ (for a variance v: √v)."),
    ] = 0.0,
    device: Annotated[
        str, typer.Option("--device", help="cpu, cuda, cuda:N, mps or auto.")
    ] = "cpu",
    dtype: Annotated[
        str, typer.Option("--dtype", help="float32, float16, bfloat16, float64.")
    ] = "float32",
    tf32: Annotated[
        bool,
        typer.Option(
            "--tf32",
            help="float32 matrix products on TF32 tensor cores (CUDA, Ampere and later): faster, "
            "relative error ~1e-3 instead of ~1e-6. Off by default.",
        ),
    ] = False,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            help="Queries per model call [default: all; models bound their own memory].",
        ),
    ] = None,
    repeat: Annotated[
        int, typer.Option("--repeat", help="Time the retrieval N times; report min and median.")
    ] = 1,
    memory_budget: Annotated[
        str | None,
        typer.Option(
            "--memory-budget",
            help="Working memory of the model in bytes, e.g. 64M or 2GiB (K/M/G = 1024-based) "
            "[default: 512MiB]; changes speed, not results.",
        ),
    ] = None,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Read the memory file from disk block by block instead of loading it, so a "
            "file larger than RAM can be searched.",
        ),
    ] = False,
    per_query: Annotated[
        bool,
        typer.Option("--per-query", help="Also report every query's metrics (JSON, CSV or table)."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print a CSV header and one row.")] = False,
    no_header: Annotated[
        bool,
        typer.Option("--no-header", help="With --csv: omit the header, for appending to a file."),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Save retrieved patterns, nearest stored index and queries (.safetensors).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace existing --out / --save-grid files.")
    ] = False,
    save_grid: Annotated[
        Path | None,
        typer.Option(
            "--save-grid", help="PNG of corrupted / retrieved / target for the first queries."
        ),
    ] = None,
    *,
    model_params: dict[str, str],
) -> None:
    """Retrieve corrupted stored patterns (or your own queries) and report error and timing.

    By default every stored pattern is a query; --mask and --noise corrupt it (mask first, then
    noise) and the uncorrupted pattern is the target. Metrics and timings are defined in the
    README, section "Retrieving".
    """
    from nphcli.errors import NphError
    from nphcli.evaluation.corruption import Corruption
    from nphcli.evaluation.evaluate import evaluate_inputs
    from nphcli.evaluation.inputs import check_output_path, load_inputs
    from nphcli.evaluation.report import save_results
    from nphcli.evaluation.settings import RetrieveSettings

    if as_json and as_csv:
        raise NphError("choose one of --json and --csv")
    if no_header and not as_csv:
        raise NphError("--no-header goes with --csv")
    outputs = [path for path in (out, save_grid) if path is not None]
    if len(outputs) == 2 and out.resolve() == save_grid.resolve():
        raise NphError("--out and --save-grid name the same file")
    for path in outputs:
        check_output_path(
            path, force=force, protect=[memory, *(p for p in (queries_file, targets_file) if p)]
        )
    settings = RetrieveSettings(
        model=model,
        params={name: parse_single(name, text) for name, text in model_params.items()},
        corruption=Corruption(mask=mask, mask_mode=mask_mode, fill=fill, noise=noise),
        queries=queries,
        seed=seed,
        device=device,
        dtype=dtype,
        batch_size=batch_size,
        repeat=repeat,
        memory_budget=None if memory_budget is None else parse_size(memory_budget),
        tf32=tf32,
    )
    inputs = load_inputs(
        memory,
        queries_file=queries_file,
        targets_file=targets_file,
        target_indices=None if target_indices is None else parse_indices(target_indices),
        stream=stream,
    )
    if save_grid is not None:
        from nphcli.image_grid import check_drawable, save_retrieval_grid

        check_drawable(inputs.memory)
    report = evaluate_inputs(inputs, settings)
    if out is not None:
        save_results(out, report, force=force)
    if save_grid is not None:
        save_retrieval_grid(save_grid, report, inputs.memory, force=force)

    if as_json:
        print_json(report.to_json(per_query=per_query))
    elif as_csv:
        rows = report.per_query_rows() if per_query else [report.to_row()]
        print_csv(rows, header=not no_header)
    else:
        _print_tables(report, per_query=per_query)


def _print_tables(report, *, per_query: bool) -> None:
    config = report.config
    memory, queries, corruption = config["memory"], config["queries"], config["corruption"]
    params = ", ".join(f"{key}={format_value(value)}" for key, value in config["params"].items())
    parts = []
    if corruption["mask"] > 0:
        parts.append(
            f"mask {format_value(corruption['mask'])} ({corruption['mask_mode']}, fill "
            f"{format_value(corruption['fill'])})"
        )
    if corruption["noise"] > 0:
        parts.append(f"Gaussian noise σ = {format_value(corruption['noise'])}")
    corrupted = ", then ".join(parts) or "none"
    shape = f"M={memory['M']}, d={memory['d']}" + (
        f", d_v={memory['d_v']}" if memory["hetero"] else ""
    )
    run_rows = [
        ("model", f"{config['model']} ({params})"),
        ("memory", f"{memory['file'] or '(in memory)'} ({shape})"),
        ("queries", f"{queries['Q']} ({_query_text(queries)})"),
        ("corruption", corrupted),
        ("device", f"{config['device']}, {config['dtype']}, batch {config['batch_size']}"),
        ("seed", config["seed"]),
    ]
    print_table("Run", ["setting", "value"], run_rows)
    metric_rows = [
        (name, stats["mean"], stats["std"], stats["median"])
        for name, stats in report.metrics.items()
        if stats is not None
    ]
    print_table("Metrics (per query)", ["metric", "mean", "std", "median"], metric_rows)
    timing = report.timing
    timing_rows = [
        ("load", timing["load_s"], ""),
        ("corrupt", timing["corrupt_s"], ""),
        ("transfer", timing["transfer_s"], "host ↔ device copies"),
        ("warm-up", timing["warmup_s"], "first batch, not counted"),
        ("retrieve (median)", timing["retrieve_median_s"], f"of {config['repeat']} run(s)"),
        ("retrieve (min)", timing["retrieve_min_s"], ""),
        ("metrics", timing["metrics_s"], ""),
        ("total", timing["total_s"], ""),
        ("per query", timing["us_per_query"] / 1e6, f"{format_value(timing['us_per_query'])} µs"),
        ("throughput", "", f"{format_value(timing['queries_per_s'])} queries/s"),
    ]
    print_table("Timing (seconds)", ["phase", "s", "note"], timing_rows)
    if per_query:
        rows = report.per_query_rows()
        print_table("Per query", list(rows[0]), [list(row.values()) for row in rows])


def _query_text(queries: dict) -> str:
    if queries["source"] == "stored":
        return "corrupted stored patterns; target: the uncorrupted pattern"
    targets = {
        "file": f"targets from {queries['targets_file']}",
        "indices": "targets by stored index",
        None: "no targets",
    }[queries["targets"]]
    return f"from {queries['file']}; {targets}"
