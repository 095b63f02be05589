"""Killing nph mid-write (SIGKILL, SIGINT) leaves the old file or the complete new one.

Real `nph` processes are started and signalled (forks of the `zygote` fixture's preloaded
process, each in a session of its own). To kill them at exact moments, a small wrapper
makes nph's memory writer (or a sweep's evaluation) pause at a chosen point and say so by
creating a file; the parent waits for that file, then sends the signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nphcli.memory.file import load_memory, save_memory
from nphcli.sweeps.results import read_results

# Real processes killed and interrupted: slow.
pytestmark = [pytest.mark.skipif(os.name != "posix", reason="POSIX signals"), pytest.mark.slow]

# Runs `nph` with a hook. NPH_TEST_STAGE: `empty` pauses right after the temporary file is
# created, `half` after half of it is written, `full` after all of it (before the rename);
# `evaluate` makes every sweep run take 50 ms. The hook writes NPH_TEST_READY when it pauses.
#
# The wrapper gives Ctrl-C Python's usual handler first, as for a command typed at a terminal: a
# test suite started in the background by a non-interactive shell (`pytest ... &`) inherits
# SIGINT ignored (POSIX, for asynchronous lists), every child with it, and Python then leaves
# SIGINT ignored, so the Ctrl-C test would wait for an exit that never comes.
WRAPPER = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
stage, ready = os.environ["NPH_TEST_STAGE"], os.environ["NPH_TEST_READY"]

def hold():
    for _ in range(12000):  # 10 min in short sleeps (a signal is acted on within 50 ms): the
        time.sleep(0.05)   # test signals it long before, however busy the machine

def pause():
    open(ready, "w").close()
    hold()

if stage == "evaluate":
    import nphcli.evaluation.evaluate as retrieval
    real_evaluate = retrieval.evaluate
    def evaluate(*args, **kwargs):
        with open(ready, "a") as log:
            log.write("run\n")
        if open(ready).read().count("run") > 5:
            hold()  # the sixth run waits to be killed: no race with the sweep's speed
        return real_evaluate(*args, **kwargs)
    retrieval.evaluate = evaluate
else:
    import nphcli.core.atomic as atomic
    import nphcli.memory.file as memory_file
    real_commit = atomic.Stage.commit
    def commit(self, *args, **kwargs):
        if stage == "half":
            size = os.path.getsize(self.tmp)
            with open(self.tmp, "r+b") as handle:
                handle.truncate(size // 2)
        if stage in ("half", "full"):
            pause()
        return real_commit(self, *args, **kwargs)
    atomic.Stage.commit = commit
    def opened(path, mode="r", *args, **kwargs):
        handle = open(path, mode, *args, **kwargs)
        if stage == "empty" and "w" in mode:
            pause()
        return handle
    memory_file.open = opened

from nphcli.cli.app import main
sys.argv = ["nph", *sys.argv[1:]]
main()
"""


def start(zygote, folder: Path, args: list[str], stage: str | None = None):
    """`nph ARGS` in `folder`, a child of the zygote with stdout and stderr piped."""
    env = {**os.environ, "NPH_DATA": str(folder / "data"), "PYTHONUNBUFFERED": "1"}
    env.pop("NPH_DEBUG", None)
    if stage is not None:
        env["NPH_TEST_STAGE"], env["NPH_TEST_READY"] = stage, str(folder.parent / "ready")
        args = ["-c", WRAPPER, *args]
    return zygote.popen(*args, cwd=folder, env=env)


def wait_for(condition, process, timeout: float = 600.0) -> None:
    """Wait for `condition` (an event: a file, a line, processes started); `timeout` only
    stops a test that would otherwise hang, far beyond what a busy machine takes."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"nph ended early: {process.communicate()}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("timed out waiting for nph")
        time.sleep(0.002)


def temporaries(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f".{name}.*.tmp"))


@pytest.fixture
def workplaces(tmp_path):
    """Folders, each with an old memory file: (folder, its bytes)."""

    def make(count: int) -> list[tuple[Path, bytes]]:
        out = []
        made = len(list(tmp_path.glob("run*")))
        for i in range(made, made + count):
            folder = tmp_path / f"run{i}" / "work"
            (folder / "data").mkdir(parents=True)
            save_memory(folder / "mem.safetensors", torch.arange(12.0).reshape(3, 4))
            out.append((folder, (folder / "mem.safetensors").read_bytes()))
        return out

    return make


STORE = ["store", "random", "--n", "300", "--dim", "16", "--out", "mem.safetensors", "--force"]


def test_kill_9_at_each_moment_of_a_write_keeps_the_old_file(
    zygote, workplaces, invoke, monkeypatch
):
    stages = ["empty", "half", "full"]
    places = workplaces(len(stages))
    processes = [
        start(zygote, folder, STORE, stage)
        for (folder, _), stage in zip(places, stages, strict=True)
    ]
    for (folder, old), process in zip(places, processes, strict=True):
        wait_for((folder.parent / "ready").exists, process)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        assert (folder / "mem.safetensors").read_bytes() == old
        assert len(temporaries(folder, "mem.safetensors")) == 1  # the one stray file
    # The next write of the same file on this machine removes what the killed process left.
    folder, _ = places[0]
    monkeypatch.chdir(folder)
    result = invoke(*STORE)
    assert result.exit_code == 0, result.stderr
    assert "removed" in result.stderr and "killed while writing mem.safetensors" in result.stderr
    assert temporaries(folder, "mem.safetensors") == []
    assert load_memory(folder / "mem.safetensors").patterns.shape == (300, 16)


def test_only_temporaries_of_dead_local_processes_are_removed(tmp_path):
    from nphcli.core.atomic import _host, remove_stale_temporaries

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        "dead": f".mem.safetensors.{_host()}-{dead.pid}.abc123_x.tmp",
        "alive": f".mem.safetensors.{_host()}-{os.getppid()}.abc123_x.tmp",
        "ours": f".mem.safetensors.{_host()}-{os.getpid()}.abc123_x.tmp",
        "other host": f".mem.safetensors.{_host()}x-{dead.pid}.abc123_x.tmp",
        "other file": f".other.safetensors.{_host()}-{dead.pid}.abc123_x.tmp",
        "not ours": ".mem.safetensors.tmp",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    removed = remove_stale_temporaries(tmp_path / "mem.safetensors")
    assert removed == [tmp_path / names["dead"]]
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {name for key, name in names.items() if key != "dead"}


def test_ctrl_c_mid_write_exits_130_and_cleans_up(zygote, workplaces):
    ((folder, old),) = workplaces(1)
    process = start(zygote, folder, STORE, "half")
    wait_for((folder.parent / "ready").exists, process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "Error: interrupted", repr(stderr)
    assert (folder / "mem.safetensors").read_bytes() == old
    assert temporaries(folder, "mem.safetensors") == []


def _kill_real_writes(
    zygote, places: list[tuple[Path, bytes]], delays: list[float]
) -> dict[int, str]:
    """Stores 10,000 × 784 values (31 MB) in each place, SIGKILLed `delays[i]` s after its
    temporary file appears. Checks that each place holds its old file or the complete new one;
    returns, for the writes killed after their temporary was seen, which of the two."""
    big = ["store", "random", "--n", "10000", "--dim", "784", "--out", "mem.safetensors"]
    processes = [start(zygote, folder, [*big, "--force"]) for folder, _ in places]
    seen: dict[int, float] = {}
    deadline = time.monotonic() + 600  # only against a hang: the writes end long before
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        for i, ((folder, _), process) in enumerate(zip(places, processes, strict=True)):
            if process.poll() is not None:
                continue
            if i not in seen and temporaries(folder, "mem.safetensors"):
                seen[i] = time.monotonic()
            if i in seen and time.monotonic() >= seen[i] + delays[i]:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=30)
        time.sleep(0.001)
    outcomes = {}
    for i, (folder, old) in enumerate(places):
        if (folder / "mem.safetensors").read_bytes() == old:
            outcome = "old"
        else:
            assert load_memory(folder / "mem.safetensors").patterns.shape == (10000, 784)
            outcome = "new"
        assert len(temporaries(folder, "mem.safetensors")) <= 1
        if i in seen:
            outcomes[i] = outcome
    return outcomes


def test_kill_9_during_a_real_write(zygote, workplaces):
    """No hook: real writes killed the moment their temporary file appears and a little later.
    On a busy machine a write can start and finish between two looks for its temporary file;
    such a round checks only that the file is old or complete, so rounds repeat until one write
    was killed with its temporary just created, which must leave the old file."""
    for _ in range(5):
        outcomes = _kill_real_writes(zygote, workplaces(2), delays=[0.0, 0.05])
        if 0 in outcomes:
            assert outcomes[0] == "old"
            return
    pytest.fail("no write was caught with its temporary file just created in 5 rounds")


def test_sweep_resume_after_kill_9_runs_every_row_once(zygote, tmp_path, invoke, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work" / "data").mkdir(parents=True)
    pool = tmp_path / "work" / "pool.npy"
    np.save(pool, np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32))
    grid = ["--dataset", str(pool), "--model", "dense,topk", "--k", "0.5", "--sizes", "4,6"]
    grid += ["--trials", "10", "--beta", "0.5", "--noise", "0.2"]
    out = tmp_path / "work" / "runs.jsonl"
    process = start(zygote, tmp_path / "work", ["sweep", *grid, "--out", str(out)], "evaluate")
    ready = tmp_path / "ready"
    wait_for(lambda: ready.exists() and ready.read_text().count("run") > 5, process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    before = read_results(out).rows
    assert 0 < len(before) < 40
    resumed = invoke("sweep", *grid, "--out", out, "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    rows = read_results(out).rows
    keys = [(r["setting"], r["trial"]) for r in rows]
    assert len(keys) == len(set(keys)) == 40  # every row exactly once
    complete = tmp_path / "complete.jsonl"
    assert invoke("sweep", *grid, "--out", complete).exit_code == 0

    def metrics(table):
        return {(r["setting"], r["trial"]): (r["sse_mean"], r["success_mean"]) for r in table}

    assert metrics(rows) == metrics(read_results(complete).rows)


# Runs `nph` with SIGTERM and SIGHUP at their defaults, as in a terminal (a suite run under
# nohup would pass SIGHUP on ignored, and nph leaves an ignored SIGHUP ignored).
WRAPPER_SIGNALS = r"""
import signal, sys
for number in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, signal.SIG_DFL)
from nphcli.cli.app import main
sys.argv = ["nph", *sys.argv[1:]]
main()
"""


def _alive_in_session(session: int) -> list[int]:
    """The processes of `session` that still run (zombies excluded), read from /proc."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):  # not a process, or it just ended
            continue
        state, _, _, sid = stat[stat.rindex(")") + 2 :].split()[:4]
        if int(sid) == session and state != "Z":
            alive.append(int(entry.name))
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_workers_stop_with_their_parent_however_it_ends(zygote, tmp_path):
    """A `--workers 3` run is sent SIGTERM, SIGHUP or SIGKILL while its workers compute: within
    seconds no process of it is left (workers, fork server, resource tracker), no semaphore is
    reported leaked, and nothing is written. TERM and HUP end it with one error line and 128 + N.
    Each run gets its own session, so everything it started can be found afterwards."""
    from nphcli.memory.shards import write_shards

    keys = torch.randn(30000, 64, generator=torch.Generator().manual_seed(0))
    save_memory(tmp_path / "mem.safetensors", keys)
    (tmp_path / "set").mkdir()
    manifest = write_shards(tmp_path / "mem.safetensors", tmp_path / "set", parts=3)
    runs = {}
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGKILL):
        out = tmp_path / f"{sig.name}.safetensors"
        args = ["retrieve", "--memory", str(manifest), "--workers", "3", "--model", "dense"]
        args += ["--beta", "0.01", "--queries", "3000", "--steps", "1000", "--out", str(out)]
        env = {**os.environ, "NPH_DATA": str(tmp_path / "data")}
        runs[sig] = (out, zygote.popen("-c", WRAPPER_SIGNALS, *args, cwd=tmp_path, env=env))
    for sig, (_, process) in runs.items():
        # parent, fork server, resource tracker and three workers
        wait_for(lambda process=process: len(_alive_in_session(process.pid)) >= 6, process)
        time.sleep(1.0)
        assert process.poll() is None  # still computing when signalled
        process.send_signal(sig)
    for sig, (out, process) in runs.items():
        _, stderr = process.communicate(timeout=30)  # every holder of stderr has ended
        deadline = time.monotonic() + 120  # gone within a second on a quiet machine
        while _alive_in_session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _alive_in_session(process.pid) == [], sig.name
        assert "leaked" not in stderr, stderr
        assert not out.exists()
        if sig == signal.SIGKILL:
            assert process.returncode == -sig
        else:
            assert process.returncode == 128 + sig, stderr
            assert stderr.splitlines() == [
                f"Error: stopped by {sig.name}; every worker was stopped, nothing was written"
            ]


WRAPPER_INTERRUPT = r"""
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if inherited off
from nphcli.cli.app import main
sys.argv = ["nph", *sys.argv[1:]]
main()
"""


def _fork_server_importing(session: int) -> bool:
    """Whether the fork server of `session` runs and has begun to load torch."""
    for pid in _alive_in_session(session):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"forkserver" in command and b"libtorch" in Path(f"/proc/{pid}/maps").read_bytes():
                return True
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_ctrl_c_while_workers_start_is_one_line(zygote, tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: sent once the fork server of a
    `--workers 2` run is loading torch (it printed a traceback there), it ends the run with the one
    `interrupted` line and exit status 130, without the fork server's traceback, and leaves no
    process behind."""
    from nphcli.memory.shards import write_shards

    save_memory(tmp_path / "m.safetensors", torch.randn(50, 8, generator=torch.Generator()))
    manifest = write_shards(tmp_path / "m.safetensors", tmp_path, parts=2)
    args = ["retrieve", "--memory", manifest.name, "--workers", "2", "--queries", "4"]
    process = zygote.popen("-c", WRAPPER_INTERRUPT, *args, "--out", "r.safetensors", cwd=tmp_path)
    wait_for(lambda: _fork_server_importing(process.pid), process)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr.splitlines() == ["Error: interrupted"], stderr
    assert not (tmp_path / "r.safetensors").exists()
    # The run has ended, so `wait_for` would look once: the fork server may still be exiting.
    deadline = time.monotonic() + 120  # only against a hang: gone within a second
    while _alive_in_session(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_in_session(process.pid) == []
