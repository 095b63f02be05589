"""Shared fixtures. The suite runs on CPU; NPH_TEST_DEVICE=cuda runs the same tests on a GPU."""

from __future__ import annotations

import os

import pytest
import torch
from typer.testing import CliRunner


def pytest_configure(config) -> None:
    # Under pytest-xdist every worker is its own process: one torch thread each keeps the workers
    # from competing for the cores (most tests are single-threaded Python around small tensors).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def _test_device() -> torch.device:
    name = os.environ.get("NPH_TEST_DEVICE", "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("NPH_TEST_DEVICE asks for CUDA but none is available", allow_module_level=True)
    return torch.device(name)


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device under test (cpu unless NPH_TEST_DEVICE says otherwise)."""
    return _test_device()


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def invoke(runner):
    """Run the real `nph` CLI in-process; returns click's Result (exit_code, stdout, stderr)."""
    from nphcli.cli import app

    def run(*args: str, **kwargs):
        return runner.invoke(app, [str(a) for a in args], **kwargs)

    return run
