"""`nph analyze FILE`: the paper's §4 theory on a memory file (separation, well-separation,
and with --model the Theorem 4.1 / Corollary 4.1 checks on corrupted queries).

Parsing and rendering only; `nphcli.theory.analysis` does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nphcli.cli.app import app
from nphcli.cli.model_options import parse_single, with_model_options
from nphcli.cli.options import JsonOutput, Mask, Noise, QueryCount, Seed
from nphcli.cli.render import format_value, print_json, print_table
from nphcli.defaults import DEFAULT_BETA


@app.command("analyze")
@with_model_options
def analyze_command(
    file: Annotated[Path, typer.Argument(help="Memory file to analyse.")],
    beta: Annotated[
        float | None,
        typer.Option(
            "--beta",
            help=f"Inverse temperature β of the conditions and the model [default: "
            f"{DEFAULT_BETA}].",
        ),
    ] = None,
    k: Annotated[
        float | None,
        typer.Option(
            "--k",
            help="Support size k in the conditions: a count ≥ 1 or a fraction of M [default: "
            "M, dense; with --model, the model's support].",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Also retrieve corrupted stored patterns with this model and check Theorem 4.1 "
            "and Corollary 4.1 per query (dense, topk, random, window).",
        ),
    ] = None,
    mask: Mask = 0.0,
    noise: Noise = 0.0,
    queries: QueryCount = None,
    seed: Seed = 0,
    sample: Annotated[
        int,
        typer.Option(
            "--sample",
            help="Use a seeded sample of this many patterns for R and Δ when M is larger; 0 "
            "uses every pattern (R is then exact).",
        ),
    ] = 2000,
    fixed_point: Annotated[
        int,
        typer.Option(
            "--fixed-point",
            help="With --model: also iterate N steps from each corrupted query, and dense "
            "retrieval beside it, and count fixed points, energy descent and final errors "
            "(Corollary 4.3); 0 skips it.",
        ),
    ] = 0,
    per_pattern: Annotated[
        bool,
        typer.Option(
            "--per-pattern", help="List Δ_μ and the well-separation verdict of every pattern."
        ),
    ] = False,
    per_query: Annotated[
        bool, typer.Option("--per-query", help="With --model: list every query's check.")
    ] = False,
    as_json: JsonOutput = False,
    *,
    model_params: dict[str, str],
) -> None:
    """Separation statistics and the paper's well-separation condition per pattern.

    m = max ‖ξ_μ‖, R = ½ min ‖ξ_μ − ξ_ν‖, Δ_μ = ⟨ξ_μ,ξ_μ⟩ − max over ν≠μ of ⟨ξ_μ,ξ_ν⟩; pattern μ
    is well separated when Δ_μ ≥ (1/β)·ln((M + k − 2)·m/R) + 2mR. With --model, corrupted
    stored patterns are retrieved and each query's error is compared with the Theorem 4.1
    bound m(M + k − 2)·exp(−β(⟨ξ_μ,x⟩ − max over ν≠μ of ⟨ξ_μ,ξ_ν⟩)); README, "Sweeps", and
    docs/reproduction.md.
    """
    from nphcli.memory.file import load_memory
    from nphcli.theory.analysis import AnalysisRequest, analyze

    request = AnalysisRequest(
        beta=beta,
        k=k,
        model=model,
        params={name: parse_single(name, text) for name, text in model_params.items()},
        mask=mask,
        noise=noise,
        queries=queries,
        seed=seed,
        sample=sample,
        fixed_point=fixed_point,
        per_pattern=per_pattern,
        per_query=per_query,
    )
    request.check()
    result = analyze(load_memory(file), request, source=str(file))
    if as_json:
        print_json(result)
        return
    _print(result)


def _print(result: dict) -> None:
    ws = result["well_separation"]
    delta = ws["delta"] or {}
    rows = [
        ("patterns", f"M = {result['M']}, d = {result['d']}"),
        ("m = max ‖ξ_μ‖", ws["m"]),
        ("R = ½ min ‖ξ_μ − ξ_ν‖", ws["R"] if ws["R"] is not None else "- (M < 2)"),
        (
            "Δ_μ",
            ", ".join(f"{key} {format_value(delta[key])}" for key in delta) or "-",
        ),
        ("β, k", f"{format_value(ws['beta'])}, {ws['k']}"),
        ("threshold", ws["threshold"] if ws["threshold"] is not None else "inf (R = 0)"),
        (
            "well separated",
            f"{ws['well_separated']} of {ws['patterns_checked']} patterns"
            + (" (sampled)" if ws["sampled"] else ""),
        ),
    ]
    support = result["well_separation_support"]
    rows.append(
        (
            "well separated, R over the support",
            f"{support['well_separated']} of {support['patterns_checked']} patterns "
            f"(k = {support['k']})",
        )
    )
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
    return (
        ", ".join(
            f"{name} {format_value(summary[f'{name}_tightness_min'])}"
            for name in names
            if summary.get(f"{name}_tightness_min") is not None
        )
        or "-"
    )
