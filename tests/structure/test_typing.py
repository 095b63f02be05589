"""The public API and the settings classes pass a type checker as a user's script meets them:
`mypy --strict` on `nphcli/__init__.py`, `nphcli/schema/` and the README-style example
`tests/data/typed_api_example.py` (keyword arguments of `Corruption`, `RetrieveSettings`, ...,
the `Memory` that `open_memory` returns). pyproject.toml's [tool.mypy] leaves the libraries
unread, so the check takes seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_strict_passes_on_the_public_api(tmp_path):
    pytest.importorskip("mypy")
    if not (ROOT / "nphcli" / "py.typed").is_file():
        pytest.fail("nphcli/py.typed is missing: type checkers would ignore the package's hints")
    example = ROOT / "tests" / "data" / "typed_api_example.py"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            "nphcli/__init__.py",
            "nphcli/schema/",
            str(example),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_keyword_is_a_type_error_a_checker_sees():
    """Plain dataclasses: an unknown keyword is Python's own TypeError, naming it, and what a
    type checker flags before the script runs (no rewritten constructor in between)."""
    import nphcli as nph

    with pytest.raises(TypeError, match="nose"):
        nph.Corruption(nose=0.1)  # type: ignore[call-arg]
