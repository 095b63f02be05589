"""The researchers' corruptions beside mask and noise: occluding squares, salt-and-pepper and bit
flips, checked entry by entry against what their definitions say."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_one_error_line

from nphcli.core.errors import NphError
from nphcli.evaluation.corruption import Corruption, corrupt


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _binary(q: int, d: int) -> torch.Tensor:
    return torch.where(torch.rand(q, d, generator=_gen(9)) < 0.5, -1.0, 1.0)


@pytest.mark.parametrize("side", [0.25, 0.5, 1.0])
def test_occlusion_is_one_whole_square_per_query_at_seeded_places(side):
    images = torch.rand(40, 2 * 7 * 9, generator=_gen(1)) + 1  # (Q, C·H·W), never 0
    out = corrupt(
        images, Corruption(occlude=side, fill=0.0), generator=_gen(2), item_shape=(2, 7, 9)
    )
    size = int(side * 7 + 0.5)
    corners = set()
    for row, hidden in zip(out.queries, out.hidden, strict=True):
        square = hidden.view(2, 7, 9)
        assert torch.equal(square[0], square[1])  # every channel of a pixel
        rows = square[0].any(dim=1).nonzero().squeeze(1)
        cols = square[0].any(dim=0).nonzero().squeeze(1)
        assert rows.numel() == cols.numel() == size and int(square[0].sum()) == size * size
        assert int(rows[-1] - rows[0]) == size - 1 and int(cols[-1] - cols[0]) == size - 1
        assert bool((row[hidden] == 0).all()) and bool((row[~hidden] != 0).all())
        corners.add((int(rows[0]), int(cols[0])))
    assert len(corners) > (1 if side < 1 else 0)  # random places (one place when it fills H)
    again = corrupt(images, Corruption(occlude=side), generator=_gen(2), item_shape=(2, 7, 9))
    assert torch.equal(again.hidden, out.hidden)


def test_occlusion_needs_images():
    with pytest.raises(NphError, match="--occlude .* needs image memories"):
        corrupt(torch.rand(2, 10), Corruption(occlude=0.5), generator=_gen())


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 1.0])
def test_salt_and_pepper_sets_exactly_the_fraction_to_the_extremes(fraction):
    clean = torch.rand(30, 50, generator=_gen(3)) * 4 - 1  # (Q, d), continuous: no ties
    out = corrupt(clean, Corruption(salt_pepper=fraction), generator=_gen(4)).queries
    changed = out != clean
    high, low = clean.amax(1, keepdim=True), clean.amin(1, keepdim=True)
    extreme = (out == high) | (out == low)
    assert bool((out[changed] == torch.where(out == high, high, low)[changed]).all())
    count = int(fraction * 50 + 0.5)
    # an entry set to the value it already had (its row's extreme) does not show as changed
    assert bool((changed.sum(1) <= count).all()) and bool((changed.sum(1) >= count - 2).all())
    assert bool((extreme.sum(1) >= count).all())
    if fraction == 1.0:
        salt = (out == high).float().mean()
        assert 0.4 < float(salt) < 0.6  # each chosen entry salt with probability ½


@pytest.mark.parametrize("fraction", [0.1, 0.3])
def test_flip_flips_exactly_the_fraction_of_pm1_and_01_patterns(fraction):
    signs = _binary(20, 40)
    out = corrupt(signs, Corruption(flip=fraction), generator=_gen(5)).queries
    assert bool(((out != signs).sum(1) == int(fraction * 40 + 0.5)).all())
    assert bool((out.abs() == 1).all())
    bits = (signs + 1) / 2
    flipped = corrupt(bits, Corruption(flip=fraction), generator=_gen(5)).queries
    assert torch.equal(flipped, (out + 1) / 2)  # the same entries, the same seed


def test_flip_refuses_real_values_and_fractions_are_checked():
    with pytest.raises(NphError, match="--flip flips bits of ±1 or 0/1 patterns"):
        corrupt(torch.rand(2, 10), Corruption(flip=0.1), generator=_gen())
    for name in ("occlude", "salt_pepper", "flip"):
        with pytest.raises(NphError, match="must be a fraction in \\[0, 1\\]"):
            Corruption(**{name: 1.5})


def test_cli_takes_the_new_corruptions_and_records_them(invoke, mnist):
    result = invoke(
        "retrieve",
        "--memory",
        mnist,
        "--queries",
        "5",
        "--occlude",
        "0.3",
        "--salt-pepper",
        "0.05,0.1",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert [row["config"]["corruption"]["salt_pepper"] for row in rows] == [0.05, 0.1]
    assert all(row["config"]["corruption"]["occlude"] == 0.3 for row in rows)
    plain = json.loads(invoke("retrieve", "--memory", mnist, "--queries", "2", "--json").stdout)
    assert "flip" not in plain["config"]["corruption"]  # absent unless set
    bad = invoke("retrieve", "--memory", mnist, "--queries", "2", "--flip", "0.1")
    assert_one_error_line(bad, "--flip flips bits")
