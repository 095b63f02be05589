"""`nph analyze`: the §4 theory (`nphcli.theory`) on one memory, optionally with a model's
retrieval of corrupted stored patterns checked query by query."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nphcli.core.defaults import DEFAULT_BETA
from nphcli.core.errors import NphError
from nphcli.schema.fields import default
from nphcli.schema.settings import AnalysisOptions

if TYPE_CHECKING:  # reading the options (`nph analyze --help`) imports no torch
    from nphcli.memory.bank import Memory

# The retrieval options `nph analyze` shares with `nph retrieve` (the model's parameters too).
RETRIEVAL_FIELDS = ("model", "mask", "noise", "queries", "seed")


@dataclass(frozen=True, kw_only=True)
class AnalysisRequest:
    """What to analyse: analyze's own options, and optionally a model whose retrieval of
    corrupted stored patterns is checked query by query."""

    options: AnalysisOptions = field(default_factory=AnalysisOptions)
    model: str | None = None  # also retrieve with this model and check it per query
    params: dict[str, Any] = field(default_factory=dict)  # model parameters given (β: also the
    # conditions'; DEFAULT_BETA when not given)
    retrieval: dict[str, Any] = field(default_factory=dict)  # mask, noise, queries, seed given

    @property
    def beta(self) -> float:
        """β of the conditions and the model."""
        return self.params.get("beta", DEFAULT_BETA)

    @property
    def seed(self) -> int:
        return self.retrieval.get("seed", default("seed"))

    def check(self) -> None:
        """Refuse option combinations that cannot mean anything, before any work."""
        if not self.beta > 0:
            raise NphError(f"--beta must be > 0, got {self.beta}")
        used = [v for name, v in self.retrieval.items() if name != "seed"]
        used += [self.options.per_query, self.options.fixed_point]
        params = [name for name in self.params if name != "beta"]
        if self.model is None and (params or any(v not in (None, 0, False) for v in used)):
            flags = "".join(f"--{name}, " for name in params)
            hint = "; the conditions' support size is --theorem-k" if "k" in params else ""
            raise NphError(
                f"{flags}--mask, --noise, --queries, --per-query and --fixed-point go with "
                f"--model{hint}"
            )


def analyze(memory: Memory, request: AnalysisRequest, *, source: str | None = None) -> dict:
    """The JSON-ready result of `nph analyze` (see its --help and the README)."""
    from nphcli.theory.well_separated import support_reading, well_separation

    request.check()
    options = request.options
    beta, k = request.beta, options.theorem_k
    checked = None
    if request.model is not None:
        checked = _check_model(memory, request, source)
        if k is None:  # the conditions with the model's own support size
            k = int(checked["check"].k.max())
    rows = options.sample or None
    separated = well_separation(memory.patterns, beta, k, max_rows=rows, seed=request.seed)
    support = support_reading(memory.patterns, beta, k, max_rows=rows, seed=request.seed)
    result: dict[str, Any] = {
        "file": source,
        "M": memory.num_memories,
        "d": memory.dim,
        "well_separation": separated.to_json(per_pattern=options.per_pattern),
        "well_separation_support": support.to_json(),
    }
    if checked is not None:
        result.update(_query_results(memory, request, checked["report"], checked["check"]))
    return result


def _check_model(memory: Memory, request: AnalysisRequest, source: str | None):
    """Retrieve corrupted stored patterns with the model (float64) and check Theorem 4.1."""
    from nphcli.evaluation.evaluate import evaluate
    from nphcli.evaluation.settings import settings_from
    from nphcli.theory.checks import check_report, is_structured

    params = {**request.params, "beta": request.beta}
    settings = settings_from(request.model, params, {**request.retrieval, "dtype": "float64"})
    report = evaluate(memory, settings, sources={"memory": source})
    if not is_structured(request.model, report.config["params"]):
        raise NphError(
            f"Theorem 4.1 covers softmax over a support set (dense, topk, random, window) "
            f"with one step; {request.model!r} with these parameters is not one of them"
        )
    check = check_report(memory, report)
    if check is None:
        raise NphError("Theorem 4.1 needs M ≥ 2 and a memory without separate values")
    return {"report": report, "check": check}


def _query_results(memory: Memory, request: AnalysisRequest, report, check) -> dict[str, Any]:
    queries: dict[str, Any] = {
        "model": request.model,
        "params": report.config["params"],
        "corruption": report.config["corruption"],
        "R": check.R,
        "summary": check.summary(),
    }
    if request.options.per_query:
        queries["per_query"] = check.per_query()
    out: dict[str, Any] = {"queries": queries}
    if request.options.fixed_point:
        from nphcli.theory.energy import fixed_point_check

        out["fixed_point"] = fixed_point_check(
            request.model,
            report.config["params"],
            memory.patterns,
            report.queries,
            report.per_query["target_index"],
            report.per_query["query_row"],
            steps=request.options.fixed_point,
        )
    return out
