"""Shared fixtures and checks. The suite runs on CPU; NPH_TEST_DEVICE=cuda runs the same tests on
a GPU. Test modules import the plain helpers (`from conftest import assert_one_error_line`)."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

# Triton reads this when it is first imported: on a CPU run its kernels
# (tests/devices/test_triton_kernels.py) run in its interpreter; a CUDA run compiles them.
# Nothing else on the CPU path uses Triton.
if not os.environ.get("NPH_TEST_DEVICE", "cpu").startswith("cuda"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import typer.main  # noqa: E402
import typer.testing  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

_built_commands: dict[tuple, object] = {}


def _cached_command(app: typer.Typer):
    """typer's CliRunner rebuilds the whole click command tree from the typer app on every
    invoke (about 0.2 s of signature introspection, most of a small command's run). The tree
    changes only with what its build reads: the registered models (a parameter option and its
    help) and typer's switch for its completion options' shell detection. So it is built once
    per app and value of those."""
    from nphcli.models import model_names
    from nphcli.schema.fields import param_fields

    params = tuple((field.name, field.help) for field in param_fields())
    completion = os.environ.get("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION")
    key = (app, len(app.registered_commands), tuple(model_names()), params, completion)
    if key not in _built_commands:
        _built_commands[key] = typer.main.get_command(app)
    return _built_commands[key]


def pytest_configure(config) -> None:
    # Under pytest-xdist every worker is its own process: one torch thread each keeps the workers
    # from competing for the cores (most tests are single-threaded Python around small tensors).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
    # Every CliRunner (the `invoke` fixture's and the ones tests make) reuses the built command.
    pytest.MonkeyPatch().setattr(typer.testing, "_get_command", _cached_command)


def fmix32_reference(x: int) -> int:
    """MurmurHash3's fmix32 in plain Python integers: the independent reference for nph's
    hashed random masks (`engine.hashing`)."""
    x ^= x >> 16
    x = (x * 0x85EBCA6B) % 2**32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) % 2**32
    return x ^ (x >> 16)


def entmax_reference(scores: torch.Tensor, alpha: float) -> torch.Tensor:
    """The independent reference for α-entmax (`engine.functional.entmax`): row-wise, in float64,
    by 64 halvings of τ on [max x − 1, max x], x = (α−1)·s; for α − 1 < 1e-6 (where the power
    loses every digit) its limit, softmax, which it is within O((α−1)·s²) of."""
    s = scores.double()
    if alpha - 1 < 1e-6:
        return torch.softmax(s, dim=-1)
    x = (alpha - 1) * (s - s.amax(dim=-1, keepdim=True))
    lo, hi = torch.full_like(x[:, :1], -1.0), torch.zeros_like(x[:, :1])
    for _ in range(64):
        mid = (lo + hi) / 2
        mass = (x - mid).clamp(min=0).pow(1 / (alpha - 1)).sum(dim=-1, keepdim=True)
        lo, hi = torch.where(mass >= 1, mid, lo), torch.where(mass >= 1, hi, mid)
    p = (x - lo).clamp(min=0).pow(1 / (alpha - 1))
    return p / p.sum(dim=-1, keepdim=True)


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


class _Starter:
    """`run` from a `popen` answering like `subprocess.Popen`."""

    def popen(self, *args: object, **kwargs) -> Any:
        raise NotImplementedError

    def run(self, *args: object, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        """`popen`, then its output and exit status, as `subprocess.run(capture_output=True,
        text=True)` does."""
        child = self.popen(*args, **kwargs)
        out, err = child.communicate(timeout=timeout)
        return subprocess.CompletedProcess(args, child.returncode, out, err)


class Zygote(_Starter):
    """Starts real `nph` processes as forks of one process that imported torch and the CLI once
    (tests/zygote.py): about 3 s of imports less per process. `popen` answers like
    `subprocess.Popen`: a real child with its own pid, exit status, pipes and session (it leads a
    session of its own, as with `start_new_session=True`, so a test may signal its group).

    Not for a test about a fresh interpreter's start-up: what happens while importing, `python -m
    nphcli` itself, environment variables read at import (the zygote imported with its own
    environment; a child gets the one given here), or anything torch set up before the fork."""

    def __init__(self) -> None:
        self.channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "OMP_NUM_THREADS": "1",  # no thread pool to copy into the forks
            "MALLOC_ARENA_MAX": "2",  # each thread's malloc arena reserves 64 MiB of address space
        }
        script = Path(__file__).with_name("zygote.py")
        self.process = subprocess.Popen(
            [sys.executable, str(script), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        theirs.close()
        self.exits: dict[int, int] = {}
        self.requests = 0

    def receive(self, timeout: float | None) -> dict | None:
        """The zygote's next message (a pid started, or a child's exit status), None if none
        came within `timeout` seconds."""
        ready, _, _ = select.select([self.channel], [], [], timeout)
        if not ready:
            return None
        message = json.loads(self.channel.recv(1 << 16) or b"null")
        assert message is not None, "the zygote ended"
        if "exit" in message:
            self.exits[message["id"]] = message["exit"]
        return message

    def popen(
        self,
        *args: object,
        cwd: Path | str | None = None,
        env: dict[str, str] | None = None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        headroom: int | None = None,
    ) -> ZygoteChild:
        """`nph ARGS` (or `-c CODE ARGS`, as `python -c`) in a fork; `headroom` caps its address
        space at what the imports use plus that many bytes."""
        ours, theirs = [], []
        for number, stream in enumerate((stdin, stdout, stderr)):
            if stream == subprocess.PIPE:
                read, write = os.pipe()
                ours.append(open(write if number == 0 else read, "w" if number == 0 else "r"))
                theirs.append(read if number == 0 else write)
            else:
                ours.append(None)
                if stream == subprocess.DEVNULL:
                    theirs.append(os.open(os.devnull, os.O_RDWR))
                else:  # None (this process's own), a descriptor or a file
                    fd = stream.fileno() if hasattr(stream, "fileno") else stream
                    theirs.append(os.dup(number if fd is None else fd))
        self.requests += 1
        request = {
            "id": self.requests,
            "args": [str(a) for a in args],
            "cwd": str(cwd or os.getcwd()),
            "env": dict(os.environ if env is None else env),
            "headroom": headroom,
        }
        socket.send_fds(self.channel, [json.dumps(request).encode()], theirs)
        for fd in theirs:
            os.close(fd)
        while (message := self.receive(None)) and message.get("pid") is None:
            pass
        assert message["id"] == self.requests
        return ZygoteChild(self, self.requests, message["pid"], args, *ours)

    def close(self) -> None:
        self.channel.close()
        self.process.wait(timeout=60)


class ZygoteChild:
    """A child of the zygote, as much of `subprocess.Popen` as the tests use."""

    def __init__(self, zygote: Zygote, number: int, pid: int, args, stdin, stdout, stderr):
        self.zygote, self.number, self.pid, self.args = zygote, number, pid, args
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr

    @property
    def returncode(self) -> int | None:
        return self.zygote.exits.get(self.number)

    def poll(self) -> int | None:
        while self.returncode is None and self.zygote.receive(0) is not None:
            pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.zygote.receive(left) is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not a pid that may have been given to another process since
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(9)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Reads stdout and stderr to their ends (each in a thread: neither pipe fills while the
        other is read), then waits for the exit."""
        if self.stdin is not None:
            self.stdin.close()
        texts: dict[int, str] = {}
        readers = [
            threading.Thread(target=lambda i=i, s=s: texts.__setitem__(i, s.read()), daemon=True)
            for i, s in enumerate((self.stdout, self.stderr))
            if s is not None
        ]
        for reader in readers:
            reader.start()
        self.wait(timeout)
        for reader in readers:
            reader.join(timeout)
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return texts.get(0), texts.get(1)


class FreshInterpreters(_Starter):
    """`Zygote`'s interface where there is no fork or pidfd (Windows, macOS): each command in a
    fresh interpreter, as `python -m nphcli ARGS` (or `python -c CODE ARGS`)."""

    def popen(self, *args: object, env=None, headroom=None, **streams) -> subprocess.Popen:
        assert headroom is None, "a cap on address space needs the zygote (Linux)"
        words = [str(a) for a in args]
        command = [sys.executable, *([] if words[0] == "-c" else ["-m", "nphcli"]), *words]
        env = {**(os.environ if env is None else env), "PYTHONPATH": str(Path(__file__).parents[1])}
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        streams = {"stdin": subprocess.DEVNULL, **pipes, **streams}
        return subprocess.Popen(command, env=env, text=True, start_new_session=True, **streams)

    def close(self) -> None:
        pass


@pytest.fixture(scope="session")
def zygote():
    """One preloaded process per test session (each xdist worker) that forks real `nph`
    processes (`Zygote`); fresh interpreters where it cannot (`FreshInterpreters`)."""
    process = Zygote() if hasattr(os, "pidfd_open") else FreshInterpreters()
    yield process
    process.close()


def assert_one_error_line(result, *words: str, code: int = 2, stdout: bool = False) -> str:
    """The project's bad-input contract, checked on a finished command: exit `code`, exactly one
    stderr line starting with `Error:` that holds every word, no traceback, and nothing on stdout
    (`stdout=True` lets a command that printed results before failing keep them). Takes click's
    Result or a subprocess CompletedProcess; returns the line."""
    exit_code = getattr(result, "exit_code", None)
    if exit_code is None:
        exit_code = result.returncode
    assert exit_code == code, (exit_code, result.stdout, result.stderr)
    exception = getattr(result, "exception", None)
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    if not stdout:
        assert result.stdout == "", result.stdout
    return lines[0]


def _gaussian(rows: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)


def write_memory(
    path: Path, patterns: torch.Tensor | tuple[int, int], *, seed: int = 0, **options
) -> Path:
    """A memory file at `path` (a folder gets `m.safetensors`) for a test about something else than
    the file format: `patterns` as given, or `(M, d)` seeded Gaussian rows (`seed=0`). Other
    keywords go to `save_memory` (values, labels, meta, dtype, force). Returns the file's path."""
    from nphcli.memory.file import save_memory

    if isinstance(patterns, tuple):
        patterns = torch.from_numpy(_gaussian(*patterns, seed=seed))
    path = Path(path)
    return save_memory(path / "m.safetensors" if path.is_dir() else path, patterns, **options)


@pytest.fixture(scope="session")
def memory_file(tmp_path_factory):
    """40 Gaussian patterns of 16 values (seeded) as a memory file: the small memory most CLI
    tests read. Session-wide, so tests must not write to it."""
    return write_memory(tmp_path_factory.mktemp("memory") / "memory.safetensors", (40, 16), seed=3)


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    """40 random 16-dimensional patterns as a .npy file: a fast dataset for sweeps."""
    path = tmp_path_factory.mktemp("pool") / "pool.npy"
    np.save(path, _gaussian(40, 16, seed=0))
    return path


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """20 random 28 × 28 grey images in [0, 1] as a memory file (fast: no dataset is read)."""
    images = torch.rand(20, 784, generator=torch.Generator().manual_seed(0))
    meta = {"kind": "image", "item_shape": [1, 28, 28]}
    return write_memory(tmp_path_factory.mktemp("digits") / "memory.safetensors", images, meta=meta)


@pytest.fixture(scope="session")
def mnist(tmp_path_factory):
    """100 real MNIST digits as `nph store mnist --n 100 --normalize minmax` writes them (pixels
    in [0, 1], the paper's scaling; the default for images is `centered`)."""
    from nphcli.cli import app

    path = tmp_path_factory.mktemp("mnist") / "memory.safetensors"
    result = CliRunner().invoke(
        app, ["store", "mnist", "--n", "100", "--normalize", "minmax", "--out", str(path)]
    )
    assert result.exit_code == 0, result.stderr
    return path


def real_valued_models() -> list[str]:
    """The registered models that take any real-valued memories: all but the classical networks
    (`binary`), which store ±1 patterns only and have their own tests
    (tests/models/test_baselines.py)."""
    from nphcli.models import get_model_info, model_names

    return [name for name in model_names() if not get_model_info(name).cls.binary]


def family_params(name: str, **params):
    """`params` less those of the Hopfield family (β, steps, tol) that model `name` does not
    take: the baselines take none of them (nearest) or no β (the classical networks)."""
    from nphcli.models import get_model_info

    takes = {p.name for p in get_model_info(name).params}
    return {k: v for k, v in params.items() if k in takes or k not in ("beta", "steps", "tol")}


def beta_flag(name: str, beta) -> list[str]:
    """`--beta BETA` for a model that takes β, nothing for one that does not."""
    return ["--beta", str(beta)] if family_params(name, beta=beta) else []


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def phase_rows(trials=(0, 1)):
    """Two models over β × noise; success falls with noise and rises with β (dense shifted)."""
    rows = []
    for model, shift in (("dense", 0.0), ("sparse", 0.3)):
        for beta in (0.1, 1.0, 10.0):
            for noise in (0.0, 0.5, 1.0):
                for trial in trials:
                    success = min(1.0, max(0.0, 0.5 + shift + 0.1 * beta - noise + 0.1 * trial))
                    rows.append(
                        {
                            "label": model, "model": model, "trial": trial, "M": 100,
                            "beta": beta, "noise": noise, "mask": 0.0,
                            "success_mean": success, "sse_mean": 10 * (1 - success),
                        }
                    )  # fmt: skip
    return rows


def tensors_in(value) -> list[torch.Tensor]:
    """The tensors in an aten op's arguments or results (in lists, tuples and dicts): what
    torch's tree_flatten finds, without its generic walk, which cost most of a recorded run."""
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


class PeakTracker(TorchDispatchMode):
    """Peak bytes of tensor storages alive at once among those allocated while active."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # a view shares its input's storage: nothing allocated
            return out
        given = {t.untyped_storage().data_ptr() for t in tensors_in((args, kwargs))}
        for tensor in tensors_in(out):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in given:  # in-place and out= ops write into inputs
                self._count(storage)
        return out

    def _count(self, storage) -> None:
        key = storage.data_ptr()
        if key in self._seen:
            return
        self._seen.add(key)
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._release, key, storage.nbytes())

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes
