"""`nph analyze FILE`: the paper's §4 theory on a memory file (separation, well-separation,
and with --model the Theorem 4.1 / Corollary 4.1 checks on corrupted queries).

`nph analyze --capacity` (no FILE): the capacity experiment (Proposition 4.1 / Ramsauer et al.
Theorem 3) on seeded random patterns (`nphcli.theory.capacity`).

Parsing and rendering only; `nphcli.app.analyze` does the work.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from nphcli.app.analyze import RETRIEVAL_FIELDS
from nphcli.cli.app import app
from nphcli.cli.field_options import field_values, own_values, with_fields
from nphcli.cli.render import format_value, print_json, print_table
from nphcli.core.defaults import CAPACITY_BETA, CAPACITY_MODELS
from nphcli.core.errors import NphError
from nphcli.schema.fields import ANALYSIS_FIELDS, get_field
from nphcli.schema.option import Field, arguments, options_of
from nphcli.theory.capacity import CapacityRequest

# `nph analyze --capacity`: the switch, then the experiment's settings as `CapacityRequest`
# declares them, unset unless given (the request holds the defaults their help states).
CAPACITY_FIELDS = (
    Field(
        "capacity",
        "bool",
        False,
        "Run the capacity experiment instead (Proposition 4.1, Ramsauer et al. Theorem 3): "
        "success against M for seeded random patterns on a sphere, beside the stated capacity "
        f"M*; --model runs one model [default: {', '.join(CAPACITY_MODELS)}], --beta defaults "
        f"to {CAPACITY_BETA:g} (Ramsauer et al.'s example). Takes no FILE.",
        group="analysis",
    ),
    *(dataclasses.replace(f, default=None) for f in options_of(CapacityRequest, "analysis")),
)
OWN_FIELDS = (*ANALYSIS_FIELDS, *CAPACITY_FIELDS, get_field("json"), get_field("threads"))


@app.command("analyze")
@with_fields(
    RETRIEVAL_FIELDS,
    own=OWN_FIELDS,
    help={
        "model": "With it, corrupted stored patterns are retrieved by this model and checked "
        "against Theorem 4.1 (`nph models` lists the models; their parameters are options "
        "too); one value.  [default: none, the memory alone is analysed]"
    },
)
def analyze_command(
    file: Annotated[
        Path | None, typer.Argument(help="Memory file to analyse (required unless --capacity).")
    ] = None,
    *,
    given: dict[str, Any],
) -> None:
    """Separation statistics and the paper's well-separation condition per pattern.

    m = max ‖ξ_μ‖, R = ½ min ‖ξ_μ − ξ_ν‖, Δ_μ = ⟨ξ_μ,ξ_μ⟩ − max over ν≠μ of ⟨ξ_μ,ξ_ν⟩; pattern μ
    is well separated when Δ_μ ≥ (1/β)·ln((M + k − 2)·m/R) + 2mR (k: --theorem-k). With
    --model (its parameters, --beta included, are retrieve's options), corrupted stored
    patterns are retrieved and each query's error is compared with the Theorem 4.1 bound
    m(M + k − 2)·exp(−β(⟨ξ_μ,x⟩ − max over ν≠μ of ⟨ξ_μ,ξ_ν⟩)); README, "Sweeps", and
    docs/reproduction.md.

    With --capacity (and no FILE): the capacity experiment on random patterns instead; see
    docs/reproduction.md, "Proposition 4.1".
    """
    from nphcli.app.threads import use_threads

    own = own_values(given, OWN_FIELDS)
    use_threads(own.pop("threads"))
    as_json = own.pop("json")
    values = _single(field_values(given, among=OWN_FIELDS))
    analysis = {f.name: own.pop(f.name) for f in ANALYSIS_FIELDS}
    if own.pop("capacity"):
        _capacity(file, analysis, own, values, as_json)
        return
    if file is None:
        raise NphError(
            "nph analyze needs a memory FILE (or --capacity for the experiment on random patterns)"
        )
    stray = [f.flag for f in CAPACITY_FIELDS if f.name in given]
    if stray:
        raise NphError(f"{', '.join(stray)} go with --capacity")
    from nphcli.app.analyze import AnalysisRequest, analyze
    from nphcli.memory import open_memory
    from nphcli.schema.settings import AnalysisOptions

    request = AnalysisRequest(
        options=AnalysisOptions(**analysis),
        model=values.pop("model", None),
        params={k: v for k, v in values.items() if k not in RETRIEVAL_FIELDS},
        retrieval={k: v for k, v in values.items() if k in RETRIEVAL_FIELDS},
    )
    request.check()
    result = analyze(open_memory(file), request, source=str(file))
    if as_json:
        print_json(result)
        return
    _print(result)


def _capacity(file, analysis: dict, capacity: dict, values: dict, as_json: bool) -> None:
    """`--capacity`: check the options, run the experiment, print a table or JSON. The experiment
    draws its own patterns, so a FILE or an option that needs one (the analysis options, and
    --mask, --noise, --queries) is refused by flag rather than silently ignored. `values`: the
    retrieval options given, one value each (--model, --seed, the model's parameters with
    --beta)."""
    from nphcli.theory.capacity import run_capacity

    if file is not None:
        raise NphError("--capacity draws its own random patterns and takes no FILE")
    refused = {"--theorem-k": analysis["theorem_k"], "--per-pattern": analysis["per_pattern"]}
    refused.update({"--per-query": analysis["per_query"]})
    refused["--sample"] = analysis["sample"] != get_field("sample", ANALYSIS_FIELDS).default
    params = dict(values)
    model, seed = params.pop("model", None), params.pop("seed", None)
    refused.update({f"--{name}": params.pop(name, None) for name in ("mask", "noise", "queries")})
    given = [flag for flag, value in refused.items() if value not in (None, 0, False)]
    if given:
        raise NphError(f"{', '.join(given)} do not go with --capacity (they need a FILE)")
    for name in ("steps", "tol"):
        if name in params:
            raise NphError(f"--{name} does not go with --capacity; --fixed-point sets the steps")
    fields = {**arguments(CapacityRequest, capacity), "steps": analysis["fixed_point"] or None}
    fields.update({"beta": params.pop("beta", None), "seed": seed})
    fields = {name: value for name, value in fields.items() if value is not None}
    if "sizes" in fields:
        fields["sizes"] = _sizes(fields["sizes"])
    if model is not None:
        fields["models"] = (model,)
    result = run_capacity(CapacityRequest(**fields, params=params))
    if as_json:
        print_json(result)
        return
    _print_capacity(result["capacity"])


def _sizes(text: str) -> tuple[int, ...]:
    """'2,4,8' → (2, 4, 8); anything else is a one-line error naming --sizes."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise NphError(f"--sizes takes a comma list of whole numbers, got {text!r}") from None
    if not sizes:
        raise NphError("--sizes needs at least one pattern count")
    return sizes


def _single(values: dict[str, list[Any]]) -> dict[str, Any]:
    """One value per option: analyze checks one model setting."""
    for name, given in values.items():
        if len(given) != 1:
            raise NphError(f"{get_field(name).flag} takes one value in nph analyze, got {given}")
    return {name: given[0] for name, given in values.items()}


def _print(result: dict) -> None:
    ws, support = result["well_separation"], result["well_separation_support"]
    delta = ws["delta"] or {}
    rows = [
        ("patterns", f"M = {result['M']}, d = {result['d']}"),
        ("m = max ‖ξ_μ‖", ws["m"]),
        ("R = ½ min ‖ξ_μ − ξ_ν‖", ws["R"] if ws["R"] is not None else "- (M < 2)"),
        ("Δ_μ", ", ".join(f"{key} {format_value(delta[key])}" for key in delta) or "-"),
        ("β, k", f"{format_value(ws['beta'])}, {ws['k']}"),
        ("threshold", ws["threshold"] if ws["threshold"] is not None else "inf (R = 0)"),
        (
            "well separated",
            f"{ws['well_separated']} of {ws['patterns_checked']} patterns"
            + (" (sampled)" if ws["sampled"] else ""),
        ),
        (
            "well separated, R over the support",
            f"{support['well_separated']} of {support['patterns_checked']} patterns "
            f"(k = {support['k']})",
        ),
    ]
    print_table("Separation (Hu et al. 2025, §4)", ["quantity", "value"], rows)
    if ws.get("per_pattern"):
        per = ws["per_pattern"]
        print_table(
            "Per pattern",
            ["row", "Δ_μ", "well separated"],
            zip(per["row"], per["delta"], per["well_separated"], strict=True),
        )
    if result.get("queries"):
        _print_queries(result)


def _print_queries(result: dict) -> None:
    queries = result["queries"]
    s = queries["summary"]
    rows = [
        ("model", f"{queries['model']} (k mean {format_value(s['k_mean'])})"),
        ("queries", s["queries"]),
        ("target in support", s["in_support"]),
        ("query inside S_μ (‖x − ξ_μ‖ ≤ R)", s["in_sphere"]),
        ("premises (both)", s["premises"]),
        ("  of which target well separated", s["premises_well_separated"]),
        ("stated bound holds, premises", f"{s['stated_holds_premises']} of {s['premises']}"),
        ("stated bound holds, in support", f"{s['stated_holds']} of {s['in_support']}"),
        ("query-gap bound holds", f"{s['query_holds']} of {s['in_support']}"),
        ("Lemma-form bound holds", f"{s['lemma_holds']} of {s['in_support']}"),
        ("2m(k − 1)·exp(−βΔ̃) bound holds", f"{s['tight_holds']} of {s['in_support']}"),
        (
            "stated bound, max with ν = μ, holds",
            f"{s['stated_self_holds_premises']} of {s['premises']} (premises)",
        ),
        ("tightness (bound/error), min", _tightness(s)),
        ("error ≤ dense error (Cor. 4.1)", f"{s['corollary_holds']} of {s['in_support']}"),
        ("max ‖T_model − T_ref‖", s["impl_gap_max"]),
    ]
    print_table("Theorem 4.1 per query", ["check", "count"], rows)
    fixed = result.get("fixed_point")
    if fixed:
        rows = [(key, value) for key, value in fixed.items()]
        print_table("Fixed points (Corollary 4.3)", ["check", "value"], rows)
    per = queries.get("per_query")
    if per:
        names = ["target", "k", "distance", "error", "stated_bound", "stated_holds", "dense_error"]
        print_table("Per query", names, zip(*(per[n] for n in names), strict=True))


def _tightness(summary: dict) -> str:
    names = ("stated", "query", "lemma", "tight")
    mins = {name: summary.get(f"{name}_tightness_min") for name in names}
    shown = [f"{name} {format_value(value)}" for name, value in mins.items() if value is not None]
    return ", ".join(shown) or "-"


def _print_capacity(result: dict[str, Any]) -> None:
    """The bound's constants, then success against M per model with M* marked."""
    bound = result["bound"]
    m_star = bound["M_star"]
    run = (result["steps"], result["epsilon"], result["trials"], result["seed"])
    rows = [
        (
            "d, m (K)",
            f"{result['d']}, {format_value(result['radius'])} ({format_value(bound['K'])})",
        ),
        ("β, p", f"{format_value(result['beta'])}, {format_value(result['p'])}"),
        ("a, b, c", ", ".join(format_value(bound[key]) for key in ("a", "b", "c"))),
        (
            "condition c ≥ (2/√p)^(4/(d−1))",
            f"{bound['condition_met']} (needs c ≥ {format_value(bound['c_min'])})",
        ),
        ("M* = √p·c^((d−1)/4)", _m_star(m_star, bound["log10_M_star"])),
        ("sphere S_μ", result["sphere"]),
        ("steps, ε, trials, seed", ", ".join(map(format_value, run))),
    ]
    print_table(
        "Capacity (Ramsauer et al. Theorem 3; Hu et al. 2025 Prop. 4.1)",
        ["quantity", "value"],
        rows,
        width=120,
    )
    fractions = ("stored_fraction", "at_target_fraction", "premise_all", "premise_fraction")
    above = "> M*" if bound["condition_met"] else "(vacuous)"
    table = [
        [row["model"], row["M"], "≤ M*" if row["below_bound"] else above, row["all_stored"]]
        + [row[k] for k in fractions]
        for row in result["rows"]
    ]
    columns = ["model", "M", "vs M*", "all stored", "stored", "nearest is target", "premise, all"]
    columns.append("premise")
    print_table("Success against M (fractions over trials / patterns)", columns, table, width=120)


def _m_star(m_star: float, log10: float) -> str:
    if math.isinf(m_star):
        return f"10^{log10:.1f}"
    return format_value(m_star)
