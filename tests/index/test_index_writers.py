"""`nph index` on a shard manifest: two runs at once both get their record (they take turns on
the manifest's lock), and a run killed part-way leaves the working index as it was; the next run
deletes what the killed one wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from nphcli.engine.exact_search import faiss_available
from nphcli.memory.file import save_memory
from nphcli.memory.shards import write_shards

pytestmark = [
    pytest.mark.skipif(not faiss_available(), reason="FAISS (ann extra) not installed"),
    pytest.mark.skipif(os.name != "posix", reason="flock and signals"),
    pytest.mark.slow,  # real processes
]

# Runs `nph` with its shard index writer hooked. NPH_TEST_MODE `hold`: after the first index
# file, create FLAG.ready and wait for FLAG.go; `kill`: SIGKILL itself after the first file.
WRAPPER = r"""
import os, signal, sys, time
import nphcli.ann.shard_index as shard_index
mode, flag = os.environ["NPH_TEST_MODE"], os.environ["NPH_TEST_FLAG"]
real = shard_index.write_index

def write_index(*args, **kwargs):
    out = real(*args, **kwargs)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    open(flag + ".ready", "w").close()
    while not os.path.exists(flag + ".go"):
        time.sleep(0.01)
    return out

shard_index.write_index = write_index
from nphcli.cli.app import main
sys.argv = ["nph", *sys.argv[1:]]
main()
"""


def start(zygote, folder: Path, args: list, mode: str | None = None):
    """`nph ARGS` in `folder`, a child of the zygote; its stderr goes to a file (`stderr`)."""
    env = {**os.environ, "NPH_TEST_FLAG": str(folder / "flag"), "OMP_NUM_THREADS": "1"}
    if mode is not None:
        env["NPH_TEST_MODE"] = mode
        args = ["-c", WRAPPER, *args]
    log = open(folder / f"stderr-{len(list(folder.glob('stderr-*')))}.txt", "w+")  # noqa: SIM115
    process = zygote.popen(*args, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=log)
    process.log = log
    return process


def wait_for(condition, process, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            process.log.seek(0)
            raise AssertionError(f"nph ended early: {process.log.read()}")
        assert time.monotonic() < deadline, "timed out waiting for nph"
        time.sleep(0.01)


def stderr(process) -> str:
    process.log.seek(0)
    return process.log.read()


@pytest.fixture
def shard_set(tmp_path):
    keys = torch.nn.functional.normalize(torch.randn(600, 8, generator=torch.Generator()))
    save_memory(tmp_path / "memory.safetensors", keys)
    return write_shards(tmp_path / "memory.safetensors", tmp_path / "set", parts=2)


def test_two_runs_on_one_manifest_both_keep_their_record(zygote, shard_set, tmp_path, invoke):
    first = start(zygote, tmp_path, ["index", shard_set, "--kind", "ivf", "--lists", "4"], "hold")
    wait_for((tmp_path / "flag.ready").exists, first)  # holds the lock, mid-build
    second = start(zygote, tmp_path, ["index", shard_set, "--kind", "hnsw"])
    wait_for(lambda: "waiting for another nph process" in stderr(second), second)
    (tmp_path / "flag.go").touch()
    assert first.wait(timeout=120) == 0, stderr(first)
    assert second.wait(timeout=120) == 0, stderr(second)
    assert sorted(json.loads(shard_set.read_text())["indexes"]) == ["hnsw", "ivf"]
    for kind in ("ivf", "hnsw"):
        args = ["retrieve", "--memory", shard_set, "--model", "topk", "--k", "3", "--index", kind]
        result = invoke(*args, "--queries", "5")
        assert result.exit_code == 0, result.stderr


def test_a_killed_rebuild_keeps_the_working_index(zygote, shard_set, tmp_path, invoke):
    assert invoke("index", shard_set, "--kind", "ivf", "--lists", "4").exit_code == 0
    before = shard_set.read_bytes()
    files = set(os.listdir(shard_set.parent))
    killed = start(zygote, tmp_path, ["index", shard_set, "--kind", "ivf", "--force"], "kill")
    assert killed.wait(timeout=120) == -signal.SIGKILL
    assert shard_set.read_bytes() == before
    new = {name for name in set(os.listdir(shard_set.parent)) - files if name[0] != "."}
    assert len(new) == 1  # its first new index (and the lock file, which flock ignores)
    args = ["retrieve", "--memory", shard_set, "--model", "topk", "--k", "3", "--index", "ivf"]
    assert invoke(*args, "--queries", "5").exit_code == 0  # the old index still serves
    again = invoke("index", shard_set, "--kind", "ivf", "--force")
    assert again.exit_code == 0, again.stderr
    assert "an index no record names" in again.stderr
    record = json.loads(shard_set.read_text())["indexes"]["ivf"]
    named = {entry["file"] for entry in record["parts"]}
    left = set(os.listdir(shard_set.parent)) - named
    assert left == {name for name in files if not name.endswith(".index")}  # old ones deleted
    assert invoke(*args, "--queries", "5").exit_code == 0
