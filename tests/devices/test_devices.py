"""Device and dtype resolution: present devices resolve, absent ones are errors, never fallbacks."""

from __future__ import annotations

import pytest
import torch

from nphcli.core.devices import resolve_device, resolve_dtype, synchronize
from nphcli.core.errors import NphError

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")


def test_cpu_and_auto_resolve():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(" CPU ") == torch.device("cpu")
    auto = resolve_device("auto")
    expected = "cuda" if torch.cuda.is_available() else None
    if expected:
        assert auto.type == expected
    else:
        assert auto.type in ("cpu", "mps")


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "cuda:-1", "tpu", ""])
def test_unknown_device_strings_are_errors(name):
    with pytest.raises(NphError, match="unknown device"):
        resolve_device(name)


@no_cuda
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:7"])
def test_cuda_without_cuda_is_an_error(name):
    with pytest.raises(NphError, match="no CUDA device"):
        resolve_device(name)


def test_cuda_index_beyond_the_devices_is_an_error():
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(NphError, match="CUDA"):
        resolve_device(f"cuda:{count}")


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="MPS is present on this machine")
def test_mps_without_mps_is_an_error():
    with pytest.raises(NphError, match="MPS"):
        resolve_device("mps")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_resolves_and_synchronizes():
    device = resolve_device("cuda:0")
    assert device == torch.device("cuda", 0)
    x = torch.ones(1000, device=device).cumsum(0)
    synchronize(device)
    assert x[-1].item() == 1000


def test_dtypes():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("float16", torch.device("cpu")) is torch.float16
    assert resolve_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(NphError, match="unknown dtype"):
        resolve_dtype("int8")


def test_synchronize_on_cpu_returns_with_the_work_done():
    x = torch.arange(10_000, dtype=torch.float64).cumsum(0)
    synchronize(torch.device("cpu"))  # nothing to wait for on the CPU; must not fail either
    assert x[-1].item() == 10_000 * 9_999 / 2


def test_cuda_without_an_index_is_the_current_device():
    from nphcli.core.devices import canonical_device, same_device

    assert canonical_device("cpu") == torch.device("cpu")
    assert same_device("cpu", torch.device("cpu")) and not same_device("cpu", "meta")
    if torch.cuda.is_available():
        current = torch.cuda.current_device()
        assert canonical_device("cuda") == torch.device("cuda", current)
        assert same_device("cuda", torch.empty(0, device="cuda").device)


@pytest.fixture
def cpu_only(monkeypatch):
    """This machine as one without CUDA or MPS, so `auto` means the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("nphcli.core.devices._mps_available", lambda: False)


def test_auto_on_a_cpu_only_machine_is_the_cpu(cpu_only):
    assert resolve_device("auto") == torch.device("cpu")


def test_index_runs_take_a_resolved_device_only(tmp_path):
    """Layers below the CLI see a torch.device: the raw `--device` text is a bug (`auto` on a
    CPU-only machine was refused as if it were a GPU). Needs no FAISS: these checks come first."""
    from nphcli.ann.run import check_index_run
    from nphcli.models import create_model
    from nphcli.schema.settings import IndexSettings

    settings, model = IndexSettings(path=str(tmp_path / "m.index")), create_model("topk", k=2)
    with pytest.raises(TypeError, match="resolved torch.device"):
        check_index_run(settings, tmp_path / "m.safetensors", model, "auto")
    with pytest.raises(NphError, match="searches on the CPU"):
        check_index_run(settings, tmp_path / "m.safetensors", model, torch.device("cuda", 0))
