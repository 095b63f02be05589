"""Devices compared by what they are: "cuda" is the current CUDA device, reported with its index.

These run on the CPU by pretending CUDA is present (nothing is computed on it); the suite under
NPH_TEST_DEVICE=cuda checks the same on real hardware (test_streaming, test_sweep).
"""

from __future__ import annotations

import pytest
import torch
from conftest import write_memory

from nphcli.core.devices import canonical_device, same_device


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA 'present' with device 1 current, so canonical indices are visible on the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_cuda_means_the_current_device(fake_cuda):
    assert canonical_device("cuda") == torch.device("cuda", 1)
    assert canonical_device(torch.device("cuda")) == torch.device("cuda", 1)
    assert canonical_device("cuda:0") == torch.device("cuda", 0)
    assert same_device("cuda", "cuda:1") and same_device(torch.device("cuda"), "cuda:1")
    assert not same_device("cuda", "cuda:0")
    assert not same_device("cuda", "cpu")


def test_cpu_is_unchanged():
    assert canonical_device("cpu") == torch.device("cpu")
    assert same_device("cpu", torch.device("cpu"))


def test_streamed_bank_reports_the_indexed_device(fake_cuda, tmp_path):
    from nphcli.memory.streamed import StreamedBank

    path = tmp_path / "m.safetensors"
    write_memory(path, torch.rand(5, 3))
    bank = StreamedBank(path, device="cuda")
    assert bank.device == torch.device("cuda", 1)
    assert bank.to(device="cpu").to(device="cuda").device == torch.device("cuda", 1)
