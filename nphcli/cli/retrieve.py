"""`nph retrieve`: corrupt stored patterns (or read your own queries), retrieve, measure, report.

Parsing and rendering only; `nphcli.evaluation.evaluate` does the work.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.model_options import parse_lists, with_model_options
from nphcli.cli.options import Force, JsonOutput, QueryCount, Seed
from nphcli.cli.parsing import parse_indices, parse_size
from nphcli.cli.retrieve_output import print_many, print_report
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
    opts = SimpleNamespace(**locals())  # the parsed options, for the steps below
    outputs = _check_outputs(opts)
    grid = _settings_grid(opts, _index_settings(opts))
    if len(grid) > 1 and outputs:
        raise NphError(
            f"--out and --save-grid take one setting; these options give {len(grid)}: "
            "run those settings one at a time"
        )
    if len(grid) > 1 and per_query and not (as_json or as_csv):
        raise NphError("--per-query with several settings needs --json or --csv")
    load = {
        "queries_file": queries_file,
        "targets_file": targets_file,
        "target_indices": None if target_indices is None else parse_indices(target_indices),
        "stream": stream,
    }
    from nphcli.distributed.group import launched_by_torchrun

    if workers != 1 or launched_by_torchrun():
        report, shown_memory, steps_trace = _run_distributed(opts, grid, load)
    else:
        report, shown_memory, steps_trace = _run_here(opts, grid, load)
    if report is None:  # printed already (several settings), or not rank 0 of torchrun
        return
    if out is not None:
        from nphcli.evaluation.report import save_results

        save_results(out, report, force=force)
    if save_grid is not None:
        from nphcli.image_grid import save_retrieval_grid

        save_retrieval_grid(save_grid, report, shown_memory, force=force, scale=scale)
    print_report(report, opts, steps_trace)


def _check_outputs(opts) -> list[Path]:
    """Refuse, before any work, output options that cannot go together or cannot be written."""
    from nphcli.atomic import check_output

    if opts.as_json and opts.as_csv:
        raise NphError("choose one of --json and --csv")
    if opts.no_header and not opts.as_csv:
        raise NphError("--no-header goes with --csv")
    outputs = [path for path in (opts.out, opts.save_grid) if path is not None]
    if len(outputs) == 2 and opts.out.resolve() == opts.save_grid.resolve():
        raise NphError("--out and --save-grid name the same file")
    inputs = [opts.memory, *(p for p in (opts.queries_file, opts.targets_file) if p)]
    for path in outputs:
        check_output(path, force=opts.force, protect=inputs)
    if opts.out is not None:
        from nphcli.evaluation.report import check_results_output

        check_results_output(opts.out)
    if opts.save_grid is not None:
        from nphcli.image_grid import check_grid_output

        check_grid_output(opts.save_grid, scale=opts.scale)
    return outputs


def _index_settings(opts):
    """The --index search settings, or None (its options are an error without it)."""
    if opts.index is None:
        if any(v is not None for v in (opts.nprobe, opts.ef, opts.candidates, opts.check_exact)):
            raise NphError("--nprobe, --ef, --candidates and --check-exact go with --index")
        return None
    from nphcli.ann.settings import IndexSettings

    check = {} if opts.check_exact is None else {"check_exact": opts.check_exact}
    return IndexSettings(
        path=str(opts.index), nprobe=opts.nprobe, ef=opts.ef, candidates=opts.candidates, **check
    )


def _settings_grid(opts, index_settings) -> list:
    """One `RetrieveSettings` per combination of the comma lists (models, parameters, masks,
    noise levels), each checked against an --index before any work."""
    from nphcli.evaluation.corruption import Corruption
    from nphcli.evaluation.grid import settings_product
    from nphcli.evaluation.settings import RetrieveSettings, build_model

    masks, noises = _floats("--mask", opts.mask), _floats("--noise", opts.noise)
    corruption = Corruption(
        mask=masks[0],
        mask_mode=opts.mask_mode,
        fill=opts.fill,
        noise=noises[0],
        noise_clip=opts.noise_clip,
    )
    budget = None if opts.memory_budget is None else parse_size(opts.memory_budget)
    base = RetrieveSettings(
        corruption=corruption,
        queries=opts.queries,
        seed=opts.seed,
        device=opts.device,
        dtype=opts.dtype,
        batch_size=opts.batch_size,
        repeat=opts.repeat,
        memory_budget=budget,
        index=index_settings,
        tf32=opts.tf32,
    )
    models = [name.strip() for name in opts.model.split(",")]
    params = parse_lists(opts.model_params)
    grid = settings_product(base, models=models, params=params, masks=masks, noises=noises)
    if index_settings is not None:
        from nphcli.ann.run import check_index_run

        for settings in grid:
            check_index_run(index_settings, opts.memory, build_model(settings), opts.device)
    return grid


def _run_distributed(opts, grid, load):
    """One setting over --workers processes or torchrun ranks: (report or None, the memory
    to draw --save-grid from, no trace)."""
    from nphcli.distributed.retrieve import distributed_retrieve
    from nphcli.memory import open_memory

    if len(grid) > 1 or opts.trace or opts.index is not None:
        raise NphError("--workers and torchrun runs take one setting, without --trace or --index")
    shown_memory = open_memory(opts.memory, stream=True) if opts.save_grid is not None else None
    if shown_memory is not None:
        from nphcli.image_grid import check_drawable

        check_drawable(shown_memory)
    report = distributed_retrieve(
        opts.memory, grid[0], workers=opts.workers, timeout=opts.timeout, **load
    )
    return report, shown_memory, None  # report None: a torchrun rank other than 0


def _run_here(opts, grid, load):
    """Every setting in this process on inputs read once: (the report of a single setting, or
    None once several are printed; the memory; the --trace steps or None)."""
    from nphcli.evaluation.grid import evaluate_grid
    from nphcli.evaluation.inputs import load_inputs

    inputs = load_inputs(opts.memory, **load)
    if opts.save_grid is not None:
        from nphcli.image_grid import check_drawable

        check_drawable(inputs.memory)
    if opts.trace and (opts.stream or opts.as_csv or len(grid) > 1):
        raise NphError(
            "--trace goes with one setting and --json or the table, not with --stream or --csv"
        )
    reports = evaluate_grid(inputs, grid)
    if len(reports) > 1:
        print_many(grid, reports, opts)
        return None, inputs.memory, None
    steps_trace = None
    if opts.trace:
        from nphcli.theory.energy import trace_report

        trace = trace_report(inputs.memory, reports[0])
        steps_trace = trace.to_json(per_query=opts.per_query)
    return reports[0], inputs.memory, steps_trace


def _floats(flag: str, text: str) -> list[float]:
    """A number or a comma list of numbers."""
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise NphError(f"{flag} takes a number (or a comma list of them), got {text!r}") from None
