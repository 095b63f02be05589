"""Shared fixtures and checks. The suite runs on CPU; NPH_TEST_DEVICE=cuda runs the same tests on
a GPU. Test modules import the plain helpers (`from conftest import assert_one_error_line`)."""

from __future__ import annotations

import os

# Triton reads this when it is first imported: on a CPU run its kernels
# (tests/test_triton_kernels.py) run in its interpreter; a CUDA run compiles them. Nothing else
# on the CPU path uses Triton.
if not os.environ.get("NPH_TEST_DEVICE", "cpu").startswith("cuda"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import typer.main  # noqa: E402
import typer.testing  # noqa: E402
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


@pytest.fixture(scope="session")
def memory_file(tmp_path_factory):
    """40 Gaussian patterns of 16 values (seeded) as a memory file: the small memory most CLI
    tests read. Session-wide, so tests must not write to it."""
    from nphcli.memory.file import save_memory

    path = tmp_path_factory.mktemp("memory") / "memory.safetensors"
    save_memory(path, torch.from_numpy(_gaussian(40, 16, seed=3)))
    return path


@pytest.fixture(scope="session")
def pool(tmp_path_factory):
    """40 random 16-dimensional patterns as a .npy file: a fast dataset for sweeps."""
    path = tmp_path_factory.mktemp("pool") / "pool.npy"
    np.save(path, _gaussian(40, 16, seed=0))
    return path


@pytest.fixture(scope="session")
def digits(tmp_path_factory):
    """20 random 28 × 28 grey images in [0, 1] as a memory file (fast: no dataset is read)."""
    from nphcli.memory.file import save_memory

    path = tmp_path_factory.mktemp("digits") / "memory.safetensors"
    images = torch.rand(20, 784, generator=torch.Generator().manual_seed(0))
    save_memory(path, images, meta={"kind": "image", "item_shape": [1, 28, 28]})
    return path


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
    (`binary`), which store ±1 patterns only and have their own tests (tests/test_baselines.py)."""
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
