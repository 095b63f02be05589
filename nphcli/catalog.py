"""The model catalog: what each registered model is called, computes and takes, without torch.

Static commands (`nph models`, every `--help`) and the CLI's model options read the catalog, so
they never pay for importing torch. It is the model registry (`nphcli.models.registry`) when the
models are loaded in this process, and otherwise the registry's snapshot in `model_catalog.json`,
which `python -m nphcli.catalog --write` regenerates and a test keeps equal to the registry.
The README's model reference is rendered from the same cards (`python -m nphcli.catalog`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CATALOG_FILE = Path(__file__).with_name("model_catalog.json")
README_START = "<!-- models:start -->"
README_END = "<!-- models:end -->"
# Parameters every model takes (the fields of `HopfieldModel`), listed once in the README.
SHARED_PARAMS = ("beta", "steps", "tol")


@dataclass(frozen=True)
class ParamCard:
    """One keyword parameter of a model: its flag is `--` + name."""

    name: str
    type: str  # "float", "int", "bool" or "str"
    default: Any
    help: str


@dataclass(frozen=True)
class ModelCard:
    """What users read about one model."""

    name: str
    summary: str  # one line
    formula: str  # the update rule T(x)
    cost: str  # time and extra memory of one update
    params: tuple[ParamCard, ...]

    def takes(self, name: str) -> bool:
        return any(p.name == name for p in self.params)


def model_cards() -> list[ModelCard]:
    """Every model, in registration order: live when the models are loaded, else the snapshot."""
    if "nphcli.models" in sys.modules and "nphcli.models.registry" in sys.modules:
        return cards_from_registry()
    return _read_snapshot()


def get_card(name: str) -> ModelCard | None:
    return next((card for card in model_cards() if card.name == name), None)


def param_cards() -> list[tuple[ParamCard, list[str]]]:
    """Each distinct parameter name once (first card wins), with the models that take it."""
    found: dict[str, tuple[ParamCard, list[str]]] = {}
    for card in model_cards():
        for param in card.params:
            found.setdefault(param.name, (param, []))[1].append(card.name)
    return list(found.values())


def cards_from_registry() -> list[ModelCard]:
    """The cards of the live registry (imports the models, and so torch)."""
    from nphcli.models import list_models

    return [
        ModelCard(
            info.name,
            info.summary,
            info.formula,
            info.cost,
            tuple(ParamCard(p.name, p.type.__name__, p.default, p.help) for p in info.params),
        )
        for info in list_models()
    ]


def snapshot_text(cards: list[ModelCard]) -> str:
    """The JSON the snapshot file holds for `cards`."""
    return json.dumps([asdict(card) for card in cards], indent=1, ensure_ascii=False) + "\n"


def _read_snapshot() -> list[ModelCard]:
    entries = json.loads(CATALOG_FILE.read_text(encoding="utf-8"))
    return [
        ModelCard(**{**entry, "params": tuple(ParamCard(**p) for p in entry["params"])})
        for entry in entries
    ]


def models_markdown(cards: list[ModelCard]) -> str:
    """The README's model reference: one table of formulas and costs, then every model's own
    parameters."""
    lines = [
        "| model | retrieval rule T(x) | cost for Q queries, M memories |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{c.name}` | {_cell(c.formula)} | {_cell(c.cost)} |" for c in cards]
    lines += ["", "Parameters every model takes:", ""]
    lines += [_param_line(p) for p in cards[0].params if p.name in SHARED_PARAMS]
    for card in cards:
        own = [p for p in card.params if p.name not in SHARED_PARAMS]
        lines += ["", f"**`{card.name}`**: {card.summary}."]
        if own:
            lines += [""] + [_param_line(p) for p in own]
    return "\n".join(lines) + "\n"


def _param_line(p: ParamCard) -> str:
    return f"- `--{p.name}` ({p.type}, default `{p.default}`): {p.help}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare | would end the Markdown table cell


if __name__ == "__main__":
    live = cards_from_registry()
    if sys.argv[1:] == ["--write"]:
        CATALOG_FILE.write_text(snapshot_text(live), encoding="utf-8")
        print(f"wrote {CATALOG_FILE}")
    else:
        print(README_START)
        print(models_markdown(live), end="")
        print(README_END)
