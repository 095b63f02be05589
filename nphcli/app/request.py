"""A whole retrieval request: its settings, what it reads, how the work is spread and what it
reports, built from field values (`nphcli.schema.fields`) and run.

`nph retrieve` and an `nph batch` job are both one request: the command line gives text, a job
gives JSON, and both become the same `RetrieveRequest`, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.evaluation.inputs import InputSpec
from nphcli.evaluation.settings import RetrieveSettings, build_model, expand_settings
from nphcli.schema.fields import fields, get_field, holder_fields
from nphcli.schema.holders import holds, route


@dataclass(frozen=True)
@holds("output")
class OutputSpec:
    """What a request reports and writes: one attribute per output field, defaults from there."""

    per_query: bool
    trace: bool
    json: bool
    csv: bool
    no_header: bool
    out: Path | None
    save_grid: Path | None
    scale: int
    force: bool

    def __post_init__(self) -> None:
        if self.json and self.csv:
            raise NphError("choose one of --json and --csv")
        if self.no_header and not self.csv:
            raise NphError("--no-header goes with --csv")
        if self.out is not None and self.save_grid is not None:
            if self.out.resolve() == self.save_grid.resolve():
                raise NphError("--out and --save-grid name the same file")

    def files(self) -> list[Path]:
        return [path for path in (self.out, self.save_grid) if path is not None]


@dataclass(frozen=True)
@holds("request")
class RetrieveRequest:
    """One `nph retrieve` (or one batch job): every setting is evaluated on inputs read once."""

    settings: list[RetrieveSettings]
    inputs: InputSpec
    output: OutputSpec
    workers: int  # local processes (`--workers`)
    timeout: float  # seconds an exchange between ranks waits
    threads: int | None  # torch's CPU threads; None: $NPH_THREADS or torch's

    def __post_init__(self) -> None:
        many = len(self.settings) > 1
        if many and self.output.out is not None:
            raise NphError(
                f"--out takes one setting; these options give "
                f"{len(self.settings)}: run those settings one at a time"
            )
        if many and self.output.per_query and not (self.output.json or self.output.csv):
            raise NphError("--per-query with several settings needs --json or --csv")
        if self.output.trace and (self.inputs.stream or self.output.csv or many):
            raise NphError(
                "--trace goes with one setting and --json or the table, not with --stream or --csv"
            )

    @property
    def distributed(self) -> bool:
        from nphcli.distributed.group import launched_by_torchrun

        return self.workers != 1 or launched_by_torchrun()


def request_from(values: Mapping[str, Sequence[Any]]) -> RetrieveRequest:
    """The request of checked field values (name → list of values; see `Field.from_text` and
    `Field.from_json`): setting fields and model parameters may hold several values, the others
    one. Fields not given take their defaults."""
    others = {f.name for f in fields(setting=False)}
    single = {}
    for name in others & set(values):
        given = list(values[name])
        if len(given) != 1:
            raise NphError(f"{get_field(name).flag} takes one value, got {len(given)}")
        single[name] = given[0]
    setting_values = {name: v for name, v in values.items() if name not in others}
    pick = {f.name: single.get(f.name, f.default) for f in fields(setting=False)}
    output = route("output", pick)
    paths = [f.key for f in holder_fields("output") if f.kind == "path"]
    output.update({key: Path(output[key]) for key in paths if output.get(key) is not None})
    return RetrieveRequest(
        settings=expand_settings(setting_values),
        inputs=InputSpec(**{key: _plain(value) for key, value in route("input", pick).items()}),
        output=OutputSpec(**output),
        **route("request", pick),
    )


@dataclass
class Outcome:
    """What running a request gave."""

    reports: list  # one `RetrievalReport` per setting (empty on a torchrun rank other than 0)
    memory: Any  # the memory read (for --save-grid), or None
    trace: list | None = None  # the --trace steps of a single setting


def check_request(request: RetrieveRequest) -> None:
    """Refuse, before any work, outputs that cannot be written and settings an --index cannot
    serve."""
    from nphcli.core.atomic import check_output

    output = request.output
    for path in output.files():
        check_output(path, force=output.force, protect=request.inputs.files())
    if output.out is not None:
        from nphcli.evaluation.report import check_results_output

        check_results_output(output.out)
    if output.save_grid is not None:
        from nphcli.presentation.comparison_image import check_image_output

        check_image_output(output.save_grid, scale=output.scale)
    for settings in request.settings:
        if settings.index is not None:
            from nphcli.ann.run import check_index_run
            from nphcli.core.devices import resolve_device

            device = resolve_device(settings.device)
            model = build_model(settings)
            check_index_run(settings.index, request.inputs.memory, model, device)


def run_request(request: RetrieveRequest) -> Outcome:
    """Check the request, then evaluate every setting: in this process on inputs read once, or
    over --workers processes / torchrun ranks (one setting)."""
    from nphcli.app.threads import use_threads

    use_threads(request.threads)
    check_request(request)
    if request.distributed:
        return _run_distributed(request)
    return _run_here(request)


def _run_here(request: RetrieveRequest) -> Outcome:
    from nphcli.app.product import evaluate_settings
    from nphcli.evaluation.inputs import load_inputs
    from nphcli.memory.items import open_items

    spec = request.inputs
    inputs = load_inputs(
        spec.memory,
        queries_file=spec.queries_file,
        targets_file=spec.targets_file,
        target_indices=spec.target_indices,
        stream=spec.stream,
        query_text=spec.query_text,
    )
    if request.output.save_grid is not None:
        from nphcli.presentation.comparison_image import check_drawable

        check_drawable(inputs.memory)
    items = open_items(spec.memory, inputs.memory.meta)  # checked before any retrieval
    reports = evaluate_settings(inputs, request.settings)
    _add_recall(items, inputs.memory, request.settings, reports)
    if spec.queries_file is None and spec.query_text is None:  # stored patterns are queries
        _say_unretrievable(inputs.memory)
    trace = None
    if request.output.trace:
        from nphcli.theory.energy import trace_report

        trace = trace_report(inputs.memory, reports[0]).to_json(per_query=request.output.per_query)
    return Outcome(reports, inputs.memory, trace)


def _add_recall(items, memory, settings: list, reports: list) -> None:
    """With a memory whose rows have ids and texts (`items`), what each query recalled (where
    `recall.applies`): the items carrying its weight, and the item nearest its output."""
    from nphcli.core.notices import notice
    from nphcli.evaluation import recall

    if items is None:
        return
    if not recall.applies(reports[0].queries.shape[0], memory.num_memories):
        notice("not listing what each query recalled: too many queries for this memory's size")
        return
    for setting, report in zip(settings, reports, strict=True):
        model = build_model(setting)
        report.recall = recall.recall(model, memory, report.queries, report.retrieved, items=items)


def _say_unretrievable(memory) -> None:
    from nphcli.core.notices import notice
    from nphcli.theory.retrievable import recorded_or_counted, unretrievable_notice

    warning = unretrievable_notice(recorded_or_counted(memory))
    if warning:
        notice(warning)


def _run_distributed(request: RetrieveRequest) -> Outcome:
    from nphcli.distributed.retrieve import distributed_retrieve
    from nphcli.memory import open_memory
    from nphcli.memory.items import open_items

    if len(request.settings) > 1 or request.output.trace:
        raise NphError("--workers and torchrun runs take one setting, without --trace")
    spec = request.inputs
    shown = open_memory(spec.memory, stream=True)  # opened, not read: for pictures and recall
    items = open_items(spec.memory, shown.meta)
    if request.output.save_grid is not None:
        from nphcli.presentation.comparison_image import check_drawable

        check_drawable(shown)
    report = distributed_retrieve(
        spec.memory,
        request.settings[0],
        workers=request.workers,
        timeout=request.timeout,
        queries_file=spec.queries_file,
        targets_file=spec.targets_file,
        target_indices=spec.target_indices,
        stream=spec.stream,
        query_text=spec.query_text,
    )
    if report is None:
        return Outcome([], shown)
    _add_recall(items, shown, request.settings, [report])
    return Outcome([report], shown)


def save_outputs(request: RetrieveRequest, outcome: Outcome) -> None:
    """Write --out (one setting) and --save-grid (one picture of every setting)."""
    output, reports = request.output, outcome.reports
    if output.out is not None:
        from nphcli.evaluation.report import save_results

        (report,) = reports
        save_results(output.out, report, force=output.force)
    if output.save_grid is not None:
        from nphcli.presentation.comparison_image import save_comparison_grid

        save_comparison_grid(
            output.save_grid, reports, outcome.memory, force=output.force, scale=output.scale
        )


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value
