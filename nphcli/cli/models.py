"""`nph models`: list the model family from the catalog (no torch import)."""

from __future__ import annotations

from dataclasses import asdict

from nphcli.cli.app import app
from nphcli.cli.options import JsonOutput
from nphcli.cli.render import print_json, print_table


@app.command("models")
def models_command(as_json: JsonOutput = False) -> None:
    """List every retrieval model with its formula, parameters and cost."""
    from nphcli.schema.catalog import model_cards

    infos = model_cards()
    if as_json:
        print_json({"models": [asdict(info) for info in infos]})
        return
    rows = []
    for info in infos:
        params = ", ".join(f"{p.name}={p.default}" for p in info.params)
        rows.append((info.name, info.formula, params, info.cost))
    print_table(
        "Models (details: README, `nph models --json`)",
        ["model", "T(x)", "parameters", "cost"],
        rows,
    )
