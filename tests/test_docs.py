"""What users read stays true: the README's model reference and the torch-free catalog snapshot
match the registry."""

from __future__ import annotations

from pathlib import Path

from nphcli.catalog import (
    CATALOG_FILE,
    README_END,
    README_START,
    cards_from_registry,
    models_markdown,
    snapshot_text,
)
from nphcli.models import list_models

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_model_reference_is_generated_from_the_registry():
    text = README.read_text(encoding="utf-8")
    assert README_START in text and README_END in text
    section = text.split(README_START, 1)[1].split(README_END, 1)[0].strip("\n") + "\n"
    assert section == models_markdown(cards_from_registry()), (
        "README.md's model reference is stale: regenerate it with "
        "`python -m nphcli.catalog` and paste it between the markers"
    )


def test_catalog_snapshot_matches_the_registry():
    assert CATALOG_FILE.read_text(encoding="utf-8") == snapshot_text(cards_from_registry()), (
        f"{CATALOG_FILE.name} is stale: regenerate it with `python -m nphcli.catalog --write`"
    )


def test_every_model_and_parameter_is_documented():
    text = README.read_text(encoding="utf-8")
    for info in list_models():
        assert f"`{info.name}`" in text
        for p in info.params:
            assert p.help, f"{info.name}.{p.name} has no help"
            assert f"`--{p.name}`" in text
