"""--threads and $NPH_THREADS: one definition, the same on every command that computes, applied
once by `nphcli.app.threads.use_threads`; a sweep defaults to one thread; outputs do not
change."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import write_memory

from nphcli.app.threads import THREADS_ENV, use_threads
from nphcli.core.errors import NphError
from nphcli.schema.fields import get_field

COMMANDS = ("retrieve", "batch", "sweep", "analyze", "mil")


@pytest.fixture(autouse=True)
def restore_threads(monkeypatch):
    """Every test starts without $NPH_THREADS and leaves torch's threads as it found them."""
    monkeypatch.delenv(THREADS_ENV, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def memory(tmp_path):
    generator = torch.Generator().manual_seed(0)
    path = tmp_path / "memory.safetensors"
    write_memory(path, torch.randn(30, 8, generator=generator))
    return path


def test_given_then_environment_then_default(monkeypatch):
    assert use_threads(2) == 2 == torch.get_num_threads()
    assert use_threads(None, default=1) == 1
    monkeypatch.setenv(THREADS_ENV, "2")
    assert use_threads(None, default=1) == 2  # the environment beats the command's default
    assert use_threads(1) == 1  # an option beats the environment


@pytest.mark.parametrize("text", ["0", "-1", "two", "1.5"])
def test_bad_environment_value_is_one_clear_error(monkeypatch, text):
    monkeypatch.setenv(THREADS_ENV, text)
    with pytest.raises(NphError, match=f"{THREADS_ENV} must be a whole number ≥ 1"):
        use_threads(None)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_computing_command_takes_the_one_threads_option(invoke, command):
    help_text = " ".join(invoke(command, "--help", terminal_width=200).output.split())
    assert "--threads" in help_text
    assert " ".join(get_field("threads").help.split()[:6]) in help_text


@pytest.mark.parametrize("command", COMMANDS)
def test_zero_threads_is_refused_before_work(invoke, command, tmp_path):
    args = {
        "retrieve": ("--memory", tmp_path / "absent.safetensors"),
        "batch": (tmp_path / "absent.jsonl",),
        "sweep": ("--out", tmp_path / "r.jsonl"),
        "analyze": ("--capacity",),
        "mil": ("--out", tmp_path / "mil.jsonl"),
    }[command]
    result = invoke(command, *args, "--threads", "0")
    assert result.exit_code == 2
    assert "--threads must be a whole number ≥ 1, got 0" in result.stderr
    assert "Traceback" not in result.output


def test_retrieve_applies_threads_and_its_json_does_not_change(invoke, memory):
    torch.set_num_threads(1)
    plain = invoke("retrieve", "--memory", memory, "--json")
    threaded = invoke("retrieve", "--memory", memory, "--json", "--threads", "2")
    assert plain.exit_code == 0 and threaded.exit_code == 0, threaded.output
    assert torch.get_num_threads() == 2
    first, second = json.loads(plain.stdout), json.loads(threaded.stdout)
    assert first["config"] == second["config"]  # threads change speed, never the setting
    assert '"threads"' not in json.dumps(second["config"])  # no key of that name
    assert first["metrics"] == second["metrics"]


def test_batch_applies_threads_and_refuses_them_per_job(invoke, memory, tmp_path):
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        json.dumps({"memory": str(memory)})
        + "\n"
        + json.dumps({"memory": str(memory), "threads": 2})
    )
    torch.set_num_threads(2)
    result = invoke("batch", jobs, "--threads", "1")
    assert torch.get_num_threads() == 1
    first, second = (json.loads(line) for line in result.stdout.splitlines())
    assert "config" in first
    assert "does not take 'threads'" in second["error"] and "--threads" in second["error"]


def test_sweep_defaults_to_one_thread_unless_told(invoke, tmp_path, monkeypatch):
    pool = tmp_path / "pool.npy"
    np.save(pool, np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32))

    def sweep(name, *extra):
        args = ("--dataset", pool, "--sizes", "5", "--beta", "0.5", "--json")
        result = invoke("sweep", *args, "--out", tmp_path / name, *extra)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["threads"]

    torch.set_num_threads(2)
    assert sweep("a.jsonl") == 1 == torch.get_num_threads()
    assert sweep("b.jsonl", "--threads", "2") == 2 == torch.get_num_threads()
    monkeypatch.setenv(THREADS_ENV, "2")
    torch.set_num_threads(1)
    assert sweep("c.jsonl") == 2 == torch.get_num_threads()
