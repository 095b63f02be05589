"""What users read stays true: the model reference (README.md, docs/models.md) and the
torch-free catalog snapshot match the registry."""

from __future__ import annotations

from pathlib import Path

from nphcli.catalog import stale_files
from nphcli.models import list_models

README = Path(__file__).resolve().parents[1] / "README.md"


def test_generated_model_reference_and_snapshot_match_the_registry():
    """The catalog snapshot and the model reference in README.md and docs/models.md."""
    stale = [path.name for path in stale_files()]
    assert not stale, f"{stale} stale: regenerate them with `python -m nphcli.catalog --write`"


def test_every_model_and_parameter_is_documented():
    text = README.read_text(encoding="utf-8")
    for info in list_models():
        assert f"`{info.name}`" in text
        for p in info.params:
            assert p.help, f"{info.name}.{p.name} has no help"
            assert f"`--{p.name}`" in text
