"""`nph analyze --capacity`: parsing and rendering of the capacity experiment
(`nphcli.theory.capacity` does the work)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from nphcli.cli.render import format_value, print_json, print_table
from nphcli.core.errors import NphError


def capacity_mode(
    *,
    file: Path | None,
    refused: dict[str, Any],
    settings: dict[str, Any],
    values: dict[str, Any],
    as_json: bool,
) -> None:
    """Check the options, run the experiment, print a table or JSON. The experiment draws its
    own patterns, so a FILE or a memory-only option (`refused`, and --mask, --noise, --queries)
    is refused rather than silently ignored. `values`: the retrieval options given, one value
    each (--model, --seed, the model's parameters with --beta)."""
    from nphcli.theory.capacity import CapacityRequest, run_capacity

    if file is not None:
        raise NphError("--capacity draws its own random patterns and takes no FILE")
    params = dict(values)
    model, seed = params.pop("model", None), params.pop("seed", None)
    memory = {f"--{name}": params.pop(name, None) for name in ("mask", "noise", "queries")}
    given = [flag for flag, value in {**refused, **memory}.items() if value not in (None, 0, False)]
    if given:
        raise NphError(f"{', '.join(given)} do not go with --capacity (they need a FILE)")
    for name in ("steps", "tol"):
        if name in params:
            raise NphError(f"--{name} does not go with --capacity; --fixed-point sets the steps")
    fields = {name: value for name, value in settings.items() if value is not None}
    fields.update({"beta": params.pop("beta", None), "seed": seed})
    fields = {name: value for name, value in fields.items() if value is not None}
    if "sizes" in fields:
        fields["sizes"] = parse_sizes(fields["sizes"])
    if model is not None:
        fields["models"] = (model,)
    result = run_capacity(CapacityRequest(**fields, params=params))
    if as_json:
        print_json(result)
        return
    print_capacity(result["capacity"])


def parse_sizes(text: str) -> tuple[int, ...]:
    """'2,4,8' → (2, 4, 8); anything else is a one-line error naming --sizes."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise NphError(f"--sizes takes a comma list of whole numbers, got {text!r}") from None
    if not sizes:
        raise NphError("--sizes needs at least one pattern count")
    return sizes


def print_capacity(result: dict[str, Any]) -> None:
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
