"""The per-pixel success metric and the clipped-noise mode."""

from __future__ import annotations

import json

import pytest
import torch

from nphcli.core.errors import NphError
from nphcli.evaluation import metrics
from nphcli.evaluation.corruption import Corruption, corrupt


def reference_pixel_success(y, t, low, high, tol=0.1):
    out = []
    for row, target in zip(y.tolist(), t.tolist(), strict=True):
        clamped = [min(high, max(low, v)) for v in row]
        out.append(float(all(abs(a - b) <= tol for a, b in zip(clamped, target, strict=True))))
    return out


def test_pixel_success_matches_a_loop_reference():
    generator = torch.Generator().manual_seed(0)
    stored = torch.rand(6, 8, generator=generator, dtype=torch.float64)
    targets = stored[torch.tensor([0, 1, 2, 3, 4, 5])]
    scale = torch.tensor([0.0, 0.05, 0.09, 0.2, 0.5, 0.11], dtype=torch.float64)[:, None]
    retrieved = targets + scale * torch.randn(6, 8, generator=generator, dtype=torch.float64)
    retrieved[0, 0] = 5.0  # far above the range: clamping brings it to max(stored)
    low, high = metrics.value_range(stored)
    assert (low, high) == (float(stored.min()), float(stored.max()))
    got = metrics.pixel_success(retrieved, targets, low, high)
    assert got.tolist() == reference_pixel_success(retrieved, targets, low, high)
    assert 0 < float(got.sum()) < 6  # both outcomes occur
    per = metrics.per_query(retrieved, stored, targets=targets)
    assert per["pixel_success"].tolist() == got.tolist()


def test_pixel_success_clamps_before_comparing():
    stored = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    targets = stored[:1]
    # 1.3 is 0.3 above the target 1.0, but clamps to 1.0; -0.05 is within 0.1 of 0.
    assert metrics.pixel_success(torch.tensor([[-0.05, 1.3]]), targets, 0.0, 1.0).tolist() == [1.0]
    assert metrics.pixel_success(torch.tensor([[0.15, 1.0]]), targets, 0.0, 1.0).tolist() == [0.0]


def test_noise_clip_is_the_clamped_plain_noise():
    generator = torch.Generator().manual_seed(3)
    patterns = torch.rand(5, 16, generator=generator)
    plain = corrupt(patterns, Corruption(noise=0.7), generator=torch.Generator().manual_seed(1))
    clipped = corrupt(
        patterns, Corruption(noise=0.7, noise_clip=True), generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(clipped.queries, plain.queries.clamp(0.0, 1.0))
    assert float(plain.queries.min()) < 0 and float(plain.queries.max()) > 1
    # Without noise the flag changes nothing.
    same = corrupt(patterns * 2, Corruption(noise_clip=True), generator=generator)
    assert torch.equal(same.queries, patterns * 2)


def test_noise_clip_must_be_a_bool():
    with pytest.raises(NphError):
        Corruption(noise=0.1, noise_clip="yes")


def test_sweep_config_takes_noise_clip():
    from nphcli.sweeps import config as sweep_config

    plain = sweep_config.resolve(sweep_config.parse("noise = [0.5]\n", "t"), "t", {})
    assert plain.values_of("noise_clip") == plain.to_dict()["noise_clip"] == [False]
    clipped = sweep_config.resolve(
        sweep_config.parse("noise = [0.5]\nnoise_clip = true\n", "t"), "t", {}
    )
    assert clipped.values_of("noise_clip") == [True]
    assert sweep_config.resolve({}, "t", {"noise_clip": True}).values_of("noise_clip") == [True]
    with pytest.raises(NphError):
        sweep_config.resolve(sweep_config.parse('noise_clip = "yes"\n', "t"), "t", {})


def test_retrieve_reports_noise_clip_only_when_set(invoke, tmp_path):
    import json

    path = tmp_path / "m.safetensors"
    stored = invoke(  # in [0, 1]: where --noise-clip applies
        "store", "random", "--n", "20", "--dim", "8", "--normalize", "minmax", "--out", path
    )
    assert stored.exit_code == 0, stored.stderr
    common = ("retrieve", "--memory", path, "--noise", "0.5", "--json")
    plain = json.loads(invoke(*common).stdout)
    clipped = json.loads(invoke(*common, "--noise-clip").stdout)
    assert "noise_clip" not in plain["config"]["corruption"]
    assert clipped["config"]["corruption"]["noise_clip"] is True
    assert plain["metrics"]["pixel_success"] is None  # plain vectors: no pixels
    csv = invoke("retrieve", "--memory", path, "--csv").stdout.splitlines()
    assert "noise_clip" in csv[0].split(",") and "pixel_success_mean" in csv[0].split(",")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_sweep_resume_refuses_another_noise_clip(invoke, tmp_path, suffix):
    out = tmp_path / f"runs{suffix}"
    grid = ("sweep", "--dataset", "random", "--normalize", "minmax", "--sizes", "5")
    grid += ("--noise", "0.3", "--out", out)
    first = invoke(*grid, "--noise-clip")
    assert first.exit_code == 0, first.stderr
    again = invoke(*grid, "--resume")
    assert again.exit_code != 0 and "noise_clip" in again.stderr
    same = invoke(*grid, "--noise-clip", "--resume")
    assert same.exit_code == 0, same.stderr


def test_noise_clip_is_refused_where_the_memory_leaves_zero_to_one(invoke, tmp_path, mnist):
    """`--noise-clip` clamps to [0, 1]: on centered pixels in [−0.5, 0.5] it silently moved
    every query off its pattern (dense, σ = 0.5: success 0.99 → 0.77); now one line. Pixels
    in [0, 1] and noise-free runs are unchanged."""
    import numpy as np
    from conftest import assert_one_error_line

    pool = tmp_path / "centered.npy"
    np.save(pool, np.random.default_rng(0).uniform(-0.5, 0.5, size=(20, 16)).astype(np.float32))
    memory = tmp_path / "centered.safetensors"
    assert invoke("store", pool, "--normalize", "none", "--out", memory).exit_code == 0
    args = ["retrieve", "--model", "dense", "--queries", "4", "--noise-clip"]
    refused = invoke(*args, "--memory", memory, "--noise", "0.5")
    assert_one_error_line(refused, "--noise-clip", "values lie in [-0.5", "--normalize minmax")
    assert invoke(*args, "--memory", memory, "--noise", "0").exit_code == 0
    clipped = invoke(*args, "--memory", mnist, "--noise", "0.5", "--json")
    assert clipped.exit_code == 0, clipped.stderr
    assert json.loads(clipped.stdout)["config"]["corruption"]["noise_clip"] is True
