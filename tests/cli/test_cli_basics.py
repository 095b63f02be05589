"""The CLI's shared behaviour: version, help for every command, one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import assert_one_error_line, write_memory


def test_version(invoke):
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("nph ")


def test_every_command_has_help(invoke):
    from typer.main import get_command

    from nphcli.cli import app

    group = get_command(app)
    assert group.commands, "no commands registered"
    for name, command in group.commands.items():
        assert command.help, f"command {name} has no help text"
        result = invoke(name, "--help")
        assert result.exit_code == 0, (name, result.stderr)
        assert "Usage" in result.stdout
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                assert param.help, f"option {param.opts} of {name} has no help"


def test_unknown_option_is_one_line_exit_2(invoke):
    assert_one_error_line(invoke("models", "--no-such-flag"), "--no-such-flag")


def test_help_does_not_import_torch():
    code = "import sys; from nphcli.cli import app; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_python_dash_m_runs():
    out = subprocess.run(
        [sys.executable, "-m", "nphcli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("nph ")


@pytest.mark.slow
def test_a_narrow_output_encoding_gets_ascii_tables_not_a_traceback(tmp_path):
    """PYTHONIOENCODING=ascii stands for a redirected Windows console under cp1252."""
    import os

    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    run = [sys.executable, "-m", "nphcli"]
    models = subprocess.run([*run, "models"], env=env, capture_output=True, text=True)
    assert models.returncode == 0, models.stderr
    assert "Traceback" not in models.stderr
    assert "+---" in models.stdout and "dense" in models.stdout
    import torch

    memory = str(tmp_path / "m.safetensors")
    write_memory(memory, torch.eye(8, 4))
    retrieve = subprocess.run(
        [*run, "retrieve", "--memory", memory], env=env, capture_output=True, text=True
    )
    assert retrieve.returncode == 0, retrieve.stderr
    assert "Traceback" not in retrieve.stderr and "sse" in retrieve.stdout
