"""The model catalog: what each registered model is called, computes and takes, without torch.

Static commands (`nph models`, every `--help`) read it so they never import torch: the live
registry (`nphcli.models.registry`) when the models are loaded, else its snapshot in
`model_catalog.json`. The model reference in README.md and docs/models.md is rendered from the
same cards; `python -m nphcli.cli.reference --write` regenerates all three (`stale_files`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CATALOG_FILE = Path(__file__).with_name("model_catalog.json")
# Pages holding the generated model reference between the markers (in a source checkout).
DOC_FILES = tuple(Path(__file__).parents[2] / name for name in ("README.md", "docs/models.md"))
README_START = "<!-- models:start -->"
README_END = "<!-- models:end -->"
# Parameters of the Hopfield family (the fields of `HopfieldModel`), listed once in the README;
# the baselines take steps and tol (the classical networks) or none of them (nearest).
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


# The live registry's cards, once `nphcli.models` has registered every model (it calls
# `serve_live_cards`): the registry sits above this torch-free module, so it hands its cards down.
_live_cards: Callable[[], list[ModelCard]] | None = None


def serve_live_cards(provider: Callable[[], list[ModelCard]]) -> None:
    """Called by `nphcli.models` once every model is registered."""
    global _live_cards
    _live_cards = provider


def model_cards() -> list[ModelCard]:
    """Every model, in registration order: live when the models are loaded, else the snapshot."""
    return _live_cards() if _live_cards is not None else _read_snapshot()


def get_card(name: str) -> ModelCard | None:
    return next((card for card in model_cards() if card.name == name), None)


def model_card(name: str) -> ModelCard:
    """The card of the model `name`; NphError naming the models else."""
    from nphcli.core.errors import NphError
    from nphcli.core.suggest import did_you_mean

    card = get_card(name) if isinstance(name, str) else None
    if card is None:
        names = [card.name for card in model_cards()]
        if not isinstance(name, str):
            raise NphError(f"model must be a model's name (`nph models`), got {name!r}")
        raise NphError(
            f"unknown model {name!r}{did_you_mean(name, names)}; choose one of: "
            f"{', '.join(names)} (see `nph models`)"
        )
    return card


def param_cards() -> list[tuple[ParamCard, list[str]]]:
    """Each distinct parameter name once (first card wins), with the models that take it."""
    found: dict[str, tuple[ParamCard, list[str]]] = {}
    for card in model_cards():
        for param in card.params:
            found.setdefault(param.name, (param, []))[1].append(card.name)
    return list(found.values())


def cards_from_registry() -> list[ModelCard]:
    """The cards of the live registry; the caller has imported `nphcli.models` (and torch)."""
    if _live_cards is None:
        raise RuntimeError("import nphcli.models first: it serves the registry's cards")
    return _live_cards()


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
    lines += ["", "Parameters every Hopfield model takes (the baselines say which they take):", ""]
    lines += [_param_line(p) for p in cards[0].params if p.name in SHARED_PARAMS]
    for card in cards:
        family = all(card.takes(name) for name in SHARED_PARAMS)
        own = [p for p in card.params if not family or p.name not in SHARED_PARAMS]
        lines += ["", f"**`{card.name}`**: {card.summary}."]
        if own:
            lines += [""] + [_param_line(p) for p in own]
    return "\n".join(lines) + "\n"


def generated_files() -> dict[Path, str]:
    """What the snapshot and every doc page should hold for the live registry."""
    cards = cards_from_registry()
    section = f"{README_START}\n{models_markdown(cards)}{README_END}"
    files = {CATALOG_FILE: snapshot_text(cards)}
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        if README_START not in text or README_END not in text:
            raise ValueError(f"{path} lacks the markers {README_START} … {README_END}")
        before, rest = text.split(README_START, 1)
        files[path] = before + section + rest.split(README_END, 1)[1]
    return files


def stale_files() -> list[Path]:
    """The generated files whose content differs from the registry's."""
    return [path for path, text in generated_files().items() if _current(path) != text]


def _param_line(p: ParamCard) -> str:
    return f"- `--{p.name}` ({p.type}, default `{p.default}`): {p.help}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare | would end the Markdown table cell


def write_generated() -> list[Path]:
    """Rewrite the stale generated files and return them (`python -m nphcli.cli.reference
    --write` runs this)."""
    expected = generated_files()
    stale = [path for path in expected if _current(path) != expected[path]]
    for path in stale:
        path.write_text(expected[path], encoding="utf-8")
    return stale


def _current(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None
