"""`nph store --force` of a text memory, and `nph shard --force` of one, killed at every point of
the write and at random moments: the old memory and its sidecar (the old shard set) stay whole,
or the new one is complete; the next run removes whatever the killed one left (nph's temporaries,
safetensors' own, an unnamed sidecar, shards no manifest names) and says so.

One driver process (a child of the `zygote` fixture's preloaded process, so nph is imported
already) forks a child per run (milliseconds each, so hundreds of rounds fit in seconds). A child
is killed with SIGKILL right before its k-th file-system call (k = 1, 2, ... until a run
completes), or after a random delay.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
import torch

from nphcli.memory import open_memory
from nphcli.memory.file import load_memory
from nphcli.memory.items import open_items

pytestmark = [pytest.mark.skipif(os.name != "posix", reason="fork and signals"), pytest.mark.slow]

# Reads one JSON request a line: {"call": "store" | "shard", "args": [...], "step": k | null,
# "after": seconds | null, "log": PATH}; stores texts into a memory (--force) or shards one
# (--force) in a forked child, killed before its k-th file-system call or `after` seconds in;
# answers "killed", "done" or "failed".
DRIVER = r"""
import json, os, signal, sys, time, traceback
from nphcli.app.store import store_memory
from nphcli.memory.shards import write_shards

RUN = {
    "store": lambda texts, out: store_memory(texts, out, embed="hash-16", force=True),
    "shard": lambda memory, out: write_shards(memory, out, parts=2, force=True),
}

CALLS = ("replace", "rename", "fsync", "unlink", "rmdir", "mkdir", "chmod", "open")

def arm(step):
    count = [0]
    def wrap(call):
        def counted(*args, **kwargs):
            count[0] += 1
            if count[0] == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return call(*args, **kwargs)
        return counted
    for name in CALLS:
        setattr(os, name, wrap(getattr(os, name)))

for line in sys.stdin:
    request = json.loads(line)
    child = os.fork()
    if child == 0:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 2)
        if request["step"] is not None:
            arm(request["step"])
        try:
            RUN[request["call"]](*request["args"])
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    if request["after"] is not None:
        time.sleep(request["after"])
        os.kill(child, signal.SIGKILL)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        print("killed", flush=True)
    else:
        print("done" if os.WEXITSTATUS(status) == 0 else "failed", flush=True)
"""

OLD = ["the cat sat on the mat", "a dog barked", "rain tomorrow", "prices fell"]
NEW = ["an owl hooted", "the river rose", "bread was baked", "the bell rang", "snow fell"]


class Driver:
    def __init__(self, zygote, folder: Path):
        self.folder = folder
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.process = zygote.popen(
            "-c", DRIVER, cwd=folder, env=env, stdin=subprocess.PIPE, stderr=None
        )

    def store(self, texts: Path, step: int | None = None, after: float | None = None) -> str:
        return self.run("store", [texts, "m.safetensors"], step, after)

    def run(self, call: str, args: list, step: int | None = None, after: float | None = None):
        log = self.folder.parent / "log.txt"
        args = [str(arg) for arg in args]
        request = {"call": call, "args": args, "step": step, "after": after, "log": str(log)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline().strip()
        assert answer in ("killed", "done"), (answer, log.read_text())
        self.log = log.read_text()
        return answer

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def stored_texts(folder: Path) -> list[str]:
    """The texts of m.safetensors, read through its verified sidecar."""
    memory = load_memory(folder / "m.safetensors")
    items = open_items(folder / "m.safetensors", memory.meta)
    assert len(items) == memory.patterns.shape[0]
    return [item["text"] for item in items.get(range(len(items)))]


def test_kill_at_every_point_and_at_random_moments_of_a_text_store(zygote, tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("\n".join(OLD) + "\n")
    new.write_text("\n".join(NEW) + "\n")
    driver = Driver(zygote, folder)
    try:
        assert driver.store(old) == "done"
        clean = set(os.listdir(folder))
        assert len(clean) == 2  # the memory and its sidecar
        seen = {"old": 0, "new": 0}
        rounds = [(step, None) for step in range(1, 200)]
        rounds += [(None, random.Random(seed).uniform(0.0, 0.05)) for seed in range(40)]
        for step, after in rounds:
            outcome = driver.store(new, step=step, after=after)
            texts = stored_texts(folder)
            assert texts in (OLD, NEW), (step, after, os.listdir(folder))
            seen["old" if texts == OLD else "new"] += 1
            if outcome == "done" and step is not None:
                break  # every point before the end was killed
            # The next store removes what the killed one left.
            assert driver.store(old) == "done"
            assert stored_texts(folder) == OLD
            assert set(os.listdir(folder)) == clean, (step, after, driver.log)
        else:
            pytest.fail("the store never completed")
        assert seen["old"] > 5 and seen["new"] >= 1, seen
    finally:
        driver.close()


def test_next_store_names_what_it_removed(zygote, tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("\n".join(OLD) + "\n")
    new.write_text("\n".join(NEW) + "\n")
    driver = Driver(zygote, folder)
    try:
        assert driver.store(old) == "done"
        clean = set(os.listdir(folder))
        # Find the moment the new sidecar is in place and the memory not yet switched.
        for step in range(1, 200):
            assert driver.store(new, step=step) == "killed"
            extra = set(os.listdir(folder)) - clean
            if any(name.startswith("m.items.") for name in extra):
                break
            assert driver.store(old) == "done"
        assert stored_texts(folder) == OLD
        assert driver.store(old) == "done"
        assert "a sidecar no memory names" in driver.log
        assert "killed while writing" in driver.log
        assert set(os.listdir(folder)) == clean
    finally:
        driver.close()


def shard_state(out: Path) -> tuple[list[str], torch.Tensor]:
    """The texts and rows of the shard set in `out`, every shard checked against the manifest."""
    manifest = out / "m.shards.json"
    memory = open_memory(manifest)
    items = open_items(manifest, memory.meta)
    return [item["text"] for item in items.get(range(len(items)))], memory.patterns


def test_kill_at_every_point_and_at_random_moments_of_a_shard(zygote, tmp_path):
    folder, out = tmp_path / "work", tmp_path / "work" / "out"
    (folder / "old").mkdir(parents=True)
    (folder / "new").mkdir()
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("\n".join(OLD) + "\n")
    new.write_text("\n".join(NEW) + "\n")
    driver = Driver(zygote, folder)
    try:
        sources = {}
        for name, texts, rows in (("old", old, OLD), ("new", new, NEW)):
            memory = folder / name / "m.safetensors"
            assert driver.run("store", [texts, memory]) == "done"
            sources[name] = (rows, load_memory(memory).patterns, memory)
        assert driver.run("shard", [sources["old"][2], out]) == "done"
        clean = set(os.listdir(out))
        assert len(clean) == 4, clean  # the manifest, two shards, the sidecar
        seen, notes = {"old": 0, "new": 0}, set()
        rounds = [(step, None) for step in range(1, 400)]
        rounds += [(None, random.Random(seed).uniform(0.0, 0.1)) for seed in range(40)]
        for step, after in rounds:
            outcome = driver.run("shard", [sources["new"][2], out], step=step, after=after)
            texts, rows = shard_state(out)
            which = "old" if texts == OLD else "new"
            assert texts == sources[which][0], (step, after, os.listdir(out))
            assert torch.equal(rows, sources[which][1]), (step, after)
            seen[which] += 1
            if outcome == "done" and step is not None:
                break  # every point before the end was killed
            assert driver.run("shard", [sources["old"][2], out]) == "done"
            assert shard_state(out)[0] == OLD
            assert set(os.listdir(out)) == clean, (step, after, driver.log)
            notes |= {n for n in ("no shard manifest names", "killed while") if n in driver.log}
        else:
            pytest.fail("the shard never completed")
        assert seen["old"] > 5 and seen["new"] >= 1, seen
        assert notes == {"no shard manifest names", "killed while"}, notes
    finally:
        driver.close()
