"""Which banks take torch's fused attention kernel (`attention.fused_attention_chosen`), with the
dispatcher's choice replaced so the CUDA rule is checked without a GPU: on the CPU any fused
kernel; on CUDA only unmasked attention, with the flash or cuDNN kernel, asked of heads padded to
a multiple of 8."""

from __future__ import annotations

import types

import pytest
import torch

from nphcli.engine import attention

EFFICIENT = 2  # torch's memory-efficient kernel: neither math, flash nor cuDNN


def _bank(device: str, dim: int, value_dim: int):
    keys, values = torch.zeros(16, dim), torch.zeros(16, value_dim)
    return types.SimpleNamespace(
        resident=lambda: (keys, values), device=torch.device(device), dim=dim, value_dim=value_dim
    )


@pytest.mark.parametrize(
    ("device", "dim", "heads", "choice", "unmasked", "chosen"),
    [
        ("cuda", 64, 4, attention.SDPA_FLASH, True, True),
        ("cuda", 64, 4, attention.SDPA_CUDNN, True, True),
        ("cuda", 64, 4, attention.SDPA_FLASH, False, False),  # masked: blockwise on CUDA
        ("cuda", 64, 4, EFFICIENT, True, False),  # slower than blockwise at d = 784
        ("cuda", 784, 4, attention.SDPA_FLASH, True, True),  # heads of 196, asked as 200
        ("cuda", 784, 1, attention.SDPA_MATH, True, False),
        ("cpu", 784, 1, EFFICIENT, False, True),  # the CPU takes any fused kernel
        ("cpu", 784, 1, attention.SDPA_MATH, True, False),
        ("cpu", 784, 1, None, True, False),
    ],
)
def test_fused_attention_chosen(monkeypatch, device, dim, heads, choice, unmasked, chosen):
    asked: list[int] = []
    monkeypatch.setattr(
        attention, "fused_attention_choice", lambda x, k, v: asked.append(k.shape[-1]) or choice
    )
    bank = _bank(device, dim, dim)
    assert attention.fused_attention_chosen(bank, heads, unmasked=unmasked) is chosen
    width = dim // heads
    aligned = -(-width // 8) * 8 if device == "cuda" else width  # padded on CUDA only
    assert asked in ([], [aligned])
