"""`nph retrieve`: corrupt stored patterns (or read your own queries), retrieve, measure, report.

Parsing and rendering only; `nphcli.evaluation.evaluate` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.model_options import parse_lists, with_model_options
from nphcli.cli.options import Force, JsonOutput, QueryCount, Seed
from nphcli.cli.parsing import parse_indices, parse_size
from nphcli.cli.render import format_value, print_csv, print_json, print_table
from nphcli.errors import NphError


@app.command("retrieve")
@with_model_options
def retrieve_command(
    memory: Annotated[
        Path,
        typer.Option(
            "--memory",
            help="Memory file written by `nph store`, or a shard manifest from `nph shard`.",
        ),
    ] = Path("memory.safetensors"),
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="Retrieval model, or a comma list of them (e.g. dense,topk,sparse); `nph models` "
            "lists them with their parameters, which are the options below that name the models "
            "taking them. Model options, --mask and --noise also take comma lists: every "
            "combination is evaluated on the memory read once.",
        ),
    ] = "dense",
    seed: Seed = 0,
    queries: QueryCount = None,
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
        str,
        typer.Option(
            "--mask",
            metavar="NUMBER",
            help="Fraction of each query to hide, in [0, 1] (or a comma list of them).",
        ),
    ] = "0",
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
        str,
        typer.Option(
            "--noise",
            metavar="NUMBER",
            help="Gaussian noise standard deviation σ (for a variance v: √v), or a comma list.",
        ),
    ] = "0",
    noise_clip: Annotated[
        bool,
        typer.Option(
            "--noise-clip",
            help="Clamp noisy queries to [0, 1] after the noise, as the paper's released code "
            "does (for pixels stored in [0, 1]).",
        ),
    ] = False,
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
    workers: Annotated[
        int,
        typer.Option(
            "--workers",
            help="Run on N local processes (gloo), each reading its own shards of a --memory "
            "manifest from `nph shard`; results equal one process's. Under torchrun, leave at 1.",
        ),
    ] = 1,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            help="Seconds a rank waits for the others (--workers, torchrun) before every rank "
            "stops with an error naming the rank.",
        ),
    ] = 120.0,
    per_query: Annotated[
        bool,
        typer.Option("--per-query", help="Also report every query's metrics (JSON, CSV or table)."),
    ] = False,
    trace: Annotated[
        bool,
        typer.Option(
            "--trace",
            help="Also report, for each of the --steps iterations (recomputed in float64), the "
            "energy E(x_t) and ‖T(x_t) − x_t‖ (JSON `trace`, or a table); README, 'Energies'.",
        ),
    ] = False,
    as_json: JsonOutput = False,
    as_csv: Annotated[
        bool, typer.Option("--csv", help="Print a CSV header and one row per setting.")
    ] = False,
    no_header: Annotated[
        bool,
        typer.Option("--no-header", help="With --csv: omit the header, for appending to a file."),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Save retrieved patterns, nearest stored index and queries: .safetensors or "
            ".npz, as the extension says.",
        ),
    ] = None,
    force: Force = False,
    save_grid: Annotated[
        Path | None,
        typer.Option(
            "--save-grid",
            help="Picture of corrupted / retrieved / target for the first queries, rows "
            "labelled: .png, .jpg or .webp, as the extension says.",
        ),
    ] = None,
    index: Annotated[
        Path | None,
        typer.Option(
            "--index",
            help="Approximate index built by `nph index` for this memory (topk, sparse, entmax): "
            "candidates from the index, their scores exact; see docs/ann.md.",
        ),
    ] = None,
    nprobe: Annotated[
        int | None,
        typer.Option("--nprobe", help="With an ivf/ivfpq --index: lists searched [default: 16]."),
    ] = None,
    ef: Annotated[
        int | None,
        typer.Option("--ef", help="With an hnsw --index: search breadth [default: 128]."),
    ] = None,
    candidates: Annotated[
        int | None,
        typer.Option(
            "--candidates",
            help="With --index: candidates per query [default: max(64, topk's k)].",
        ),
    ] = None,
    check_exact: Annotated[
        int | None,
        typer.Option(
            "--check-exact",
            help="With --index: compare this many seeded queries with exact retrieval "
            "(recall@k, pattern and error differences); 0 skips it [default: 100].",
        ),
    ] = None,
    scale: Annotated[
        int,
        typer.Option("--scale", help="With --save-grid: enlarge every image pixel N times."),
    ] = 2,
    *,
    model_params: dict[str, str],
) -> None:
    """Retrieve corrupted stored patterns (or your own queries) and report error and timing.

    By default every stored pattern is a query; --mask and --noise corrupt it (mask first, then
    noise) and the uncorrupted pattern is the target. Metrics and timings are defined in the
    README, section "Retrieving".
    """
    from nphcli.distributed.group import launched_by_torchrun
    from nphcli.distributed.retrieve import distributed_retrieve
    from nphcli.evaluation.corruption import Corruption
    from nphcli.evaluation.grid import evaluate_grid, settings_product
    from nphcli.evaluation.inputs import check_output_path, load_inputs, open_stream
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
    if out is not None:
        from nphcli.evaluation.report import check_results_output

        check_results_output(out)
    if save_grid is not None:
        from nphcli.image_grid import check_grid_output

        check_grid_output(save_grid, scale=scale)
    index_settings = None
    if index is not None:
        from nphcli.ann.settings import IndexSettings

        check = {} if check_exact is None else {"check_exact": check_exact}
        index_settings = IndexSettings(
            path=str(index), nprobe=nprobe, ef=ef, candidates=candidates, **check
        )
    elif any(value is not None for value in (nprobe, ef, candidates, check_exact)):
        raise NphError("--nprobe, --ef, --candidates and --check-exact go with --index")
    masks, noises = _floats("--mask", mask), _floats("--noise", noise)
    base = RetrieveSettings(
        corruption=Corruption(
            mask=masks[0],
            mask_mode=mask_mode,
            fill=fill,
            noise=noises[0],
            noise_clip=noise_clip,
        ),
        queries=queries,
        seed=seed,
        device=device,
        dtype=dtype,
        batch_size=batch_size,
        repeat=repeat,
        memory_budget=None if memory_budget is None else parse_size(memory_budget),
        index=index_settings,
        tf32=tf32,
    )
    grid = settings_product(
        base,
        models=[name.strip() for name in model.split(",")],
        params=parse_lists(model_params),
        masks=masks,
        noises=noises,
    )
    if len(grid) > 1 and outputs:
        raise NphError(
            f"--out and --save-grid take one setting; these options give {len(grid)}: "
            "run those settings one at a time"
        )
    if len(grid) > 1 and per_query and not (as_json or as_csv):
        raise NphError("--per-query with several settings needs --json or --csv")
    if index_settings is not None:
        from nphcli.ann.run import check_index_run
        from nphcli.evaluation.settings import build_model

        for settings in grid:
            check_index_run(index_settings, memory, build_model(settings), device)
    load = {
        "queries_file": queries_file,
        "targets_file": targets_file,
        "target_indices": None if target_indices is None else parse_indices(target_indices),
        "stream": stream,
    }
    steps_trace = None
    if workers != 1 or launched_by_torchrun():
        if len(grid) > 1 or trace or index_settings is not None:
            raise NphError(
                "--workers and torchrun runs take one setting, without --trace or --index"
            )
        grid_memory = open_stream(memory) if save_grid is not None else None
        if grid_memory is not None:
            from nphcli.image_grid import check_drawable

            check_drawable(grid_memory)
        report = distributed_retrieve(memory, grid[0], workers=workers, timeout=timeout, **load)
        if report is None:  # a torchrun rank other than 0: rank 0 prints and writes
            return
    else:
        inputs = load_inputs(memory, **load)
        grid_memory = inputs.memory
        if save_grid is not None:
            from nphcli.image_grid import check_drawable

            check_drawable(grid_memory)
        if trace and (stream or as_csv or len(grid) > 1):
            raise NphError(
                "--trace goes with one setting and --json or the table, not with --stream or --csv"
            )
        reports = evaluate_grid(inputs, grid)
        if len(reports) > 1:
            _print_many(
                grid,
                reports,
                as_json=as_json,
                as_csv=as_csv,
                per_query=per_query,
                header=not no_header,
            )
            return
        report = reports[0]
        if trace:
            from nphcli.theory.energy import trace_report

            steps_trace = trace_report(inputs.memory, report).to_json(per_query=per_query)
    if out is not None:
        save_results(out, report, force=force)
    if save_grid is not None:
        from nphcli.image_grid import save_retrieval_grid

        save_retrieval_grid(save_grid, report, grid_memory, force=force, scale=scale)

    if as_json:
        result = report.to_json(per_query=per_query)
        if steps_trace is not None:
            result["trace"] = steps_trace
        print_json(result)
    elif as_csv:
        rows = report.per_query_rows() if per_query else [report.to_row()]
        print_csv(rows, header=not no_header)
    else:
        _print_tables(report, per_query=per_query)
        if steps_trace is not None:
            names = ["step", "energy_mean", "energy_rise_max", "residual_mean", "residual_max"]
            rows = [[item[name] for name in names] for item in steps_trace]
            print_table("Trace (float64)", names, rows)


def _print_many(grid, reports, *, as_json: bool, as_csv: bool, per_query: bool, header: bool):
    """Several settings: a JSON Lines stream, one CSV (header once), or a comparison table."""
    from nphcli.evaluation.grid import given_params

    if as_json:
        for report in reports:
            print_json(report.to_json(per_query=per_query))
        return
    if as_csv:
        rows = []
        for i, report in enumerate(reports):
            if per_query:  # which setting each query row belongs to
                model = report.config["model"]
                rows.extend({"setting": i, "model": model, **r} for r in report.per_query_rows())
            else:
                rows.append(report.to_row())
        print_csv(rows, header=header)
        return
    columns = ["model", "parameters", "mask", "noise", "sse", "success", "cosine", "support"]
    rows = []
    for settings, report in zip(grid, reports, strict=True):
        corruption, metrics = report.config["corruption"], report.metrics
        means = [
            None if metrics[name] is None else metrics[name]["mean"]
            for name in ("sse", "success", "cosine", "support")
        ]
        timing = report.timing["retrieve_median_s"]
        rows.append(
            [settings.model, given_params(settings), corruption["mask"], corruption["noise"]]
            + means
            + [timing]
        )
    first = reports[0].config
    title = (
        f"{len(reports)} settings: {first['memory']['file']} (M={first['memory']['M']}), "
        f"{first['queries']['Q']} queries, seed {first['seed']}; metric means per query"
    )
    print_table(title, [*columns, "retrieve s"], rows, width=120)


def _floats(flag: str, text: str) -> list[float]:
    """A number or a comma list of numbers."""
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise NphError(f"{flag} takes a number (or a comma list of them), got {text!r}") from None


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
    if config.get("index"):
        _print_index(config["index"])
    if per_query:
        rows = report.per_query_rows()
        # piped: as wide as the columns need, never squeezed into rich's default 80
        print_table("Per query", list(rows[0]), [list(row.values()) for row in rows], width=1000)


def _print_index(index: dict) -> None:
    search = ", ".join(
        f"{name} {index[name]}" for name in ("nprobe", "ef", "candidates") if index[name]
    )
    rows = [
        ("index", f"{index['file']} ({index['kind']}; {search})"),
        ("certified exact", index["certified_fraction"]),
    ]
    check = index["check_exact"]
    if check:
        rows += [
            (f"recall@{check['k']} (sample of {check['queries']})", check["recall_at_k"]),
            (
                "‖T − T_exact‖ mean / max",
                f"{check['pattern_gap_mean']:.3g} / {check['pattern_gap_max']:.3g}",
            ),
            ("sse − sse_exact (mean)", check["sse_difference_mean"]),
        ]
    print_table("Index (approximation cost)", ["measure", "value"], rows)


def _query_text(queries: dict) -> str:
    if queries["source"] == "stored":
        return "corrupted stored patterns; target: the uncorrupted pattern"
    targets = {
        "file": f"targets from {queries['targets_file']}",
        "indices": "targets by stored index",
        None: "no targets",
    }[queries["targets"]]
    return f"from {queries['file']}; {targets}"
