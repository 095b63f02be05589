"""What users read stays true: the README's model reference matches the registry."""

from __future__ import annotations

from pathlib import Path

from nphcli.models import list_models
from nphcli.models.catalog import END, START, models_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_model_reference_is_generated_from_the_registry():
    text = README.read_text(encoding="utf-8")
    assert START in text and END in text
    section = text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert section == models_markdown(), (
        "README.md's model reference is stale: regenerate it with "
        "`python -m nphcli.models.catalog` and paste it between the markers"
    )


def test_every_model_and_parameter_is_documented():
    text = README.read_text(encoding="utf-8")
    for info in list_models():
        assert f"`{info.name}`" in text
        for p in info.params:
            assert p.help, f"{info.name}.{p.name} has no help"
            assert f"`--{p.name}`" in text
