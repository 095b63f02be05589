"""Every benchmark script with --device stops in one line (exit 2) on a device not present."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_one_error_line

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if '"--device"' in p.read_text())


def test_the_scripts_with_a_device_option_are_found():
    assert {"run.py", "layers.py"} <= set(SCRIPTS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("script", SCRIPTS)
def test_a_missing_cuda_device_is_one_error_line(script, monkeypatch, capfd):
    """Each script run as `__main__` in this process (what is checked is its own `--device`
    handling); the fresh process a user starts is checked once, below."""
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / script), "--device", "cuda"])
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    threads = torch.get_num_threads()  # a script may set it before it reads --device
    try:
        with pytest.raises(SystemExit) as stopped:
            runpy.run_path(str(BENCHMARKS / script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    out, err = capfd.readouterr()
    line = assert_one_error_line(subprocess.CompletedProcess(script, stopped.value.code, out, err))
    assert line.startswith("Error: --device cuda: no CUDA device is available"), line


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_missing_cuda_device_is_one_error_line_in_a_fresh_process():
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "run.py"), "--device", "cuda"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    line = assert_one_error_line(result)
    assert line.startswith("Error: --device cuda: no CUDA device is available"), line


def test_provenance_names_the_commit_it_is_told(monkeypatch):
    """A checkout copied to a GPU machine kept another commit's history: NPH_BENCH_COMMIT names
    the code measured, with no "+dirty" from that history; without it, git's HEAD."""
    sys.path.insert(0, str(BENCHMARKS))
    from _common import provenance

    monkeypatch.setenv("NPH_BENCH_COMMIT", "4f999d5")
    assert provenance("m")["commit"] == "4f999d5"
    monkeypatch.delenv("NPH_BENCH_COMMIT")
    assert provenance("m")["commit"] != "4f999d5"
