"""Normalisation: each definition on hand-checked values, inverses, and the docs naming them."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.core.normalize import METHODS, default_method, normalize, to_pixels, to_raw

MEMORY_FILES = Path(__file__).resolve().parents[2] / "docs" / "memory-files.md"
PIXELS = (0.0, 255.0)


def test_unit_and_centered_on_pixels():
    raw = torch.tensor([[0.0, 51.0, 255.0]])
    x, info = normalize(raw, "minmax", pixel_range=PIXELS)
    assert torch.allclose(x, torch.tensor([[0.0, 0.2, 1.0]]))
    assert (info["lo"], info["hi"]) == (0.0, 255.0)
    centered, _ = normalize(raw, "centered", pixel_range=PIXELS)
    assert torch.allclose(centered, torch.tensor([[-0.5, -0.3, 0.5]]))


def test_unit_on_vectors_uses_the_data_range():
    raw = torch.tensor([[-2.0, 0.0], [2.0, 1.0]])
    x, info = normalize(raw, "minmax")
    assert x.tolist() == [[0.0, 0.5], [1.0, 0.75]]
    assert (info["lo"], info["hi"]) == (-2.0, 2.0)
    constant, _ = normalize(torch.full((2, 2), 3.0), "minmax")
    assert constant.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_zscore_uses_all_elements_and_records_them():
    raw = torch.tensor([[1.0, 3.0], [5.0, 7.0]])  # mean 4, population std √5
    x, info = normalize(raw, "zscore")
    assert info["mean"] == pytest.approx(4.0) and info["std"] == pytest.approx(math.sqrt(5))
    assert x.flatten().tolist() == pytest.approx([v / math.sqrt(5) for v in (-3, -1, 1, 3)])
    assert float(x.mean()) == pytest.approx(0.0, abs=1e-7)
    with pytest.raises(NphError, match="σ = 0"):
        normalize(torch.ones(3, 2), "zscore")


def test_l2_scales_each_pattern_and_keeps_zero_rows():
    raw = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.0, 2.0]])
    x, _ = normalize(raw, "l2")
    assert torch.allclose(x, torch.tensor([[0.6, 0.8], [0.0, 0.0], [0.0, 1.0]]))


def test_none_keeps_raw_values():
    raw = torch.tensor([[0.0, 255.0]])
    x, info = normalize(raw, "none", pixel_range=PIXELS)
    assert torch.equal(x, raw) and info["method"] == "none"


@pytest.mark.parametrize("method", ["none", "minmax", "centered", "zscore"])
@pytest.mark.parametrize("pixel_range", [PIXELS, None])
def test_to_raw_inverts_and_to_pixels_gives_unit_range(method, pixel_range):
    generator = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (5, 7), generator=generator).float()
    x, info = normalize(raw, method, pixel_range=pixel_range)
    assert torch.allclose(to_raw(x, info), raw, atol=1e-3)
    lo, hi = info["lo"], info["hi"]
    assert torch.allclose(to_pixels(x, info), (raw - lo) / (hi - lo), atol=1e-5)


def test_to_pixels_for_l2_and_unknown_files_rescales_each_pattern():
    raw = torch.tensor([[0.0, 100.0, 200.0], [10.0, 10.0, 60.0]])
    x, info = normalize(raw, "l2", pixel_range=PIXELS)
    expected = torch.tensor([[0.0, 0.5, 1.0], [0.0, 0.0, 1.0]])
    assert torch.allclose(to_pixels(x, info), expected)
    assert torch.allclose(to_pixels(raw, None), expected)
    with pytest.raises(NphError, match="cannot be mapped back"):
        to_raw(x, info)


def test_unknown_method_and_defaults():
    with pytest.raises(NphError, match="unknown normalisation"):
        normalize(torch.ones(1, 1), "maxmin")
    assert default_method("image") == "centered" and default_method("vector") == "none"


def test_every_method_is_defined_in_the_docs():
    text = MEMORY_FILES.read_text(encoding="utf-8")
    match = re.search(r"^## Normalisation\n(.*?)(^## |\Z)", text, re.S | re.M)
    assert match, "docs/memory-files.md has no '## Normalisation' section"
    for name in METHODS:
        assert f"`{name}`" in match.group(1), f"docs do not define --normalize {name}"


def test_importing_normalize_and_sources_does_not_import_torch():
    code = (
        "import sys; import nphcli.core.normalize, nphcli.sources; "
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
