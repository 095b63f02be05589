"""--tf32: opt-in TF32 float32 products on CUDA, off by default, recorded in the report."""

from __future__ import annotations

import json

import torch
from conftest import write_memory

from nphcli.core.devices import tf32_matmuls


def test_tf32_is_set_inside_and_restored_after():
    before = torch.backends.cuda.matmul.allow_tf32
    with tf32_matmuls(True):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == before
    with tf32_matmuls(False):
        assert not torch.backends.cuda.matmul.allow_tf32


def test_tf32_flag_is_off_by_default_and_reported(invoke, tmp_path, device):
    path = tmp_path / "m.safetensors"
    write_memory(path, torch.rand(20, 6, generator=torch.Generator().manual_seed(0)))
    common = ("retrieve", "--memory", path, "--device", str(device), "--json")
    plain = invoke(*common)
    assert plain.exit_code == 0, plain.stderr
    assert json.loads(plain.stdout)["config"]["tf32"] is False
    fast = invoke(*common, "--tf32")
    assert fast.exit_code == 0, fast.stderr
    assert json.loads(fast.stdout)["config"]["tf32"] is True
    assert not torch.backends.cuda.matmul.allow_tf32  # restored once the command is done
