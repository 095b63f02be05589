"""What users read stays true: the generated references (models, commands) match the code, the
README stays a front door, and the documentation site builds without a broken link or anchor."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nphcli.models import list_models
from nphcli.schema.catalog import stale_files

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MODELS_PAGE = ROOT / "docs" / "models.md"
STALE = "regenerate it with `python -m nphcli.cli.reference --write`"


def test_generated_model_reference_and_snapshot_match_the_registry():
    """The catalog snapshot and the model reference in README.md and docs/models.md."""
    stale = [path.name for path in stale_files()]
    assert not stale, f"{stale} stale: {STALE}"


def test_every_model_and_parameter_is_documented():
    for page in (README, MODELS_PAGE):
        text = page.read_text(encoding="utf-8")
        for info in list_models():
            assert f"`{info.name}`" in text
            for p in info.params:
                assert p.help, f"{info.name}.{p.name} has no help"
                assert f"`--{p.name}`" in text


def test_command_reference_is_current():
    from nphcli.cli.reference import PAGE, reference_markdown

    assert PAGE.read_text(encoding="utf-8") == reference_markdown(), f"docs/cli.md: {STALE}"


def test_command_reference_lists_every_command_and_option():
    """The generator walks the whole tree: a command or option missing from the page fails."""
    import typer.main

    from nphcli.cli import app
    from nphcli.cli.reference import reference_markdown

    text = reference_markdown()
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        assert f"## `nph {name}`" in text
        section = text.split(f"## `nph {name}`", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            shown = param.param_type_name == "option" and not getattr(param, "hidden", False)
            for flag in param.opts if shown else ():
                assert f"`{flag}`" in section, (name, flag)


def test_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 15_000, "README.md over 15 KB: move reference to docs/"
    headings = re.findall(r"^## (.+)$", text, re.M)
    for title in ("Install", "Quick start", "A tour", "Commands", "Documentation"):
        assert title in headings, title
    # the test command CI runs, and the fast lane
    assert "python -m pytest -q -n auto\n" in text
    assert 'python -m pytest -q -n auto -m "not slow"' in text


def test_readme_command_table_lists_every_command():
    import typer.main

    from nphcli.cli import app

    text = README.read_text(encoding="utf-8")
    table = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `nph (\S+)` \|", table, re.M))
    assert listed == set(typer.main.get_command(app).commands)


def test_every_page_is_in_the_index_and_the_site():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    site = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "index.md":
            assert f"]({page.name})" in index, f"docs/index.md does not link {page.name}"
            assert f": {page.name}" in site, f"mkdocs.yml's nav lacks {page.name}"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material are not installed (pip install -e '.[docs]')",
)
@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor in any page fails (mkdocs.yml)."""
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (site / "cli" / "index.html").exists()
    shutil.rmtree(site)


def test_readme_installs_the_test_extra_before_running_the_tests():
    """The quick start ran pytest before saying that `.[test]` is needed."""
    readme = README.read_text()
    first_test = readme.index("python -m pytest")
    assert 0 <= readme.find('pip install -e ".[test]"') < first_test


def test_the_readme_cpu_install_links_the_install_page():
    """The CPU-only line sends a reader whose CPU wheel index is unreachable, or whose torch
    and torchvision builds differ, to docs/install.md, which covers both."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    cpu = text[text.index("**CPU-only machines:**") :]
    cpu = cpu[: cpu.index("## ")]
    assert "(docs/install.md)" in cpu
