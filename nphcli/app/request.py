"""A whole retrieval request: its settings, what it reads, how the work is spread and what it
reports, built from field values (`nphcli.schema.fields`) and run.

`nph retrieve` and an `nph batch` job are both one request: the command line gives text, a job
gives JSON, and both become the same `RetrieveRequest`, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.notices import notice
from nphcli.evaluation.settings import build_model, expand_settings
from nphcli.schema.catalog import model_card
from nphcli.schema.fields import fields, get_field
from nphcli.schema.option import arguments, options_of
from nphcli.schema.settings import InputSpec, OutputSpec, RetrieveSettings, Spread
from nphcli.theory.retrievable import recorded_or_counted, unretrievable_notice


@dataclass(frozen=True, kw_only=True)
class RetrieveRequest:
    """One `nph retrieve` (or one batch job): every setting is evaluated on inputs read once."""

    settings: list[RetrieveSettings]
    inputs: InputSpec = field(default_factory=InputSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    spread: Spread = field(default_factory=Spread)

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

        return self.spread.workers != 1 or launched_by_torchrun()


def request_from(values: Mapping[str, Sequence[Any]]) -> RetrieveRequest:
    """The request of checked option values (name → list of values; see `Field.from_text` and
    `Field.from_json`): setting options and model parameters may hold several values, the
    others one. Options not given take their defaults."""
    others = {f.name for f in fields(setting=False)}
    single = {}
    for name in others & set(values):
        given = list(values[name])
        if len(given) != 1:
            raise NphError(f"{get_field(name).flag} takes one value, got {len(given)}")
        single[name] = given[0]
    output = arguments(OutputSpec, single)
    paths = [f.name for f in options_of(OutputSpec) if f.kind == "path"]
    output.update({key: Path(output[key]) for key in paths if output.get(key) is not None})
    return RetrieveRequest(
        settings=expand_settings({k: v for k, v in values.items() if k not in others}),
        inputs=InputSpec(**arguments(InputSpec, single)),
        output=OutputSpec(**output),
        spread=Spread(**arguments(Spread, single)),
    )


@dataclass
class Outcome:
    """What running a request gave."""

    reports: list  # one `RetrievalReport` per setting (empty on a torchrun rank other than 0)
    memory: Any  # the memory read (for --save-grid), or None
    trace: list | None = None  # the --trace steps of a single setting


def check_request(request: RetrieveRequest) -> list[Any]:
    """The model of every setting, each built (and checked) once; before any work, outputs that
    cannot be written and settings an --index cannot serve are refused."""
    from nphcli.core.atomic import check_output

    models = [build_model(settings) for settings in request.settings]
    output = request.output
    for path in output.files():
        check_output(path, force=output.force, protect=request.inputs.files())
    if output.out is not None:
        from nphcli.evaluation.report import check_results_output

        check_results_output(output.out)
    if output.save_grid is not None:
        from nphcli.presentation.comparison_image import check_image_output

        check_image_output(output.save_grid, scale=output.scale)
    for settings, model in zip(request.settings, models, strict=True):
        if settings.index is not None:
            from nphcli.ann.run import check_index_run
            from nphcli.core.devices import resolve_device

            check_index_run(
                settings.index, request.inputs.memory, model, resolve_device(settings.device)
            )
    return models


def run_request(request: RetrieveRequest) -> Outcome:
    """Check the request, then evaluate every setting: in this process on inputs read once, or
    over --workers processes / torchrun ranks (one setting)."""
    from nphcli.app.threads import use_threads

    use_threads(request.spread.threads)
    models = check_request(request)
    if request.distributed:
        return _run_distributed(request, models)
    return _run_here(request, models)


def _run_here(request: RetrieveRequest, models: list[Any]) -> Outcome:
    from nphcli.evaluation.inputs import read_inputs

    inputs = read_inputs(request.inputs)
    if request.output.save_grid is not None:
        from nphcli.presentation.comparison_image import check_drawable

        check_drawable(inputs.memory)
    reports = evaluate_request(request, inputs, models)
    stored = request.inputs.queries_file is None and request.inputs.query_text is None
    if stored and any(model_card(s.model).takes("beta") for s in request.settings):
        # the queries are stored patterns, scored with β
        if warning := unretrievable_notice(recorded_or_counted(inputs.memory)):
            notice(warning)
    trace = None
    if request.output.trace:
        from nphcli.theory.energy import trace_report

        trace = trace_report(inputs.memory, reports[0]).to_json(per_query=request.output.per_query)
    return Outcome(reports, inputs.memory, trace)


def evaluate_request(request: RetrieveRequest, inputs: Any, models: Sequence[Any]) -> list:
    """The report of every setting on `inputs` (read once), with what each query recalled
    where the memory's rows are items (ids and texts)."""
    from nphcli.memory.items import open_items

    items = open_items(request.inputs.memory, inputs.memory.meta)  # checked before retrieval
    reports = evaluate_settings(inputs, request.settings, models)
    _add_recall(items, inputs.memory, models, reports)
    return reports


def evaluate_settings(
    inputs: Any, grid: Sequence[RetrieveSettings], models: Sequence[Any] | None = None
) -> list:
    """Evaluate every setting of `grid` on the same `inputs` (read once), in order: start-up and
    reading the memory cost seconds, a small retrieval milliseconds. Each setting is an ordinary
    `RetrieveSettings`, so its report is exactly what a single run gives.

    Every model is built (unless given, one per setting) before the first retrieval, so a bad
    parameter fails before any work. The inputs' load time is reported by the first setting
    only (the others reuse them), so the reports' `total_s` add up to the wall time spent.
    """
    from nphcli.evaluation.evaluate import evaluate_inputs

    models = [build_model(settings) for settings in grid] if models is None else models
    reuse = dataclasses.replace(inputs, load_s=0.0)  # read once: later settings cost no load
    return [
        evaluate_inputs(inputs if i == 0 else reuse, settings, model)
        for i, (settings, model) in enumerate(zip(grid, models, strict=True))
    ]


def _add_recall(items, memory, models: Sequence[Any], reports: list) -> None:
    """With a memory whose rows have ids and texts (`items`), what each query recalled (where
    `recall.applies`): the items carrying its weight, and the item nearest its output."""
    from nphcli.evaluation import recall

    if items is None:
        return
    if not recall.applies(reports[0].queries.shape[0], memory.num_memories):
        notice("not listing what each query recalled: too many queries for this memory's size")
        return
    for model, report in zip(models, reports, strict=True):
        report.recall = recall.recall(model, memory, report.queries, report.retrieved, items=items)


def _run_distributed(request: RetrieveRequest, models: list[Any]) -> Outcome:
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
    report = distributed_retrieve(spec, request.settings[0], request.spread)
    if report is None:
        return Outcome([], shown)
    _add_recall(items, shown, models, [report])
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
