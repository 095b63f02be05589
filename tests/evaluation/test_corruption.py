"""Corruption: exact mask fractions and regions, the asked noise level, seeded reproducibility."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nphcli.core.errors import NphError
from nphcli.evaluation.corruption import Corruption, corrupt


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _patterns(q: int, d: int, seed: int = 1) -> torch.Tensor:
    return torch.rand(q, d, generator=_gen(seed)) + 0.5  # no entry equals the fill value 0


def test_no_corruption_gives_the_patterns_unchanged():
    x = _patterns(5, 784)
    out = corrupt(x, Corruption(mask=0, noise=0), generator=_gen(), item_shape=(1, 28, 28))
    assert torch.equal(out.queries, x)
    assert not out.hidden.any()
    assert out.queries.data_ptr() != x.data_ptr()  # a copy: the caller's patterns are untouched


def test_input_is_not_modified():
    x = _patterns(4, 784)
    before = x.clone()
    corrupt(x, Corruption(mask=0.5, noise=1.0), generator=_gen(), item_shape=(1, 28, 28))
    assert torch.equal(x, before)


@settings(max_examples=60, deadline=None)
@given(
    q=st.integers(1, 6),
    d=st.integers(1, 120),
    fraction=st.floats(0, 1, allow_nan=False),
    seed=st.integers(0, 2**31),
)
def test_random_mask_hides_exactly_the_rounded_fraction_of_a_vector(q, d, fraction, seed):
    x = _patterns(q, d)
    out = corrupt(x, Corruption(mask=fraction), generator=_gen(seed))
    expected = math.floor(fraction * d + 0.5)
    assert out.hidden.sum(dim=1).tolist() == [expected] * q
    assert torch.all(out.queries[out.hidden] == 0.0)
    assert torch.equal(out.queries[~out.hidden], x[~out.hidden])
    assert out.mask_mode == "random"


@pytest.mark.parametrize(
    ("mode", "fraction", "region"),
    [
        ("bottom", 0.5, (slice(14, 28), slice(None))),
        ("top", 0.5, (slice(0, 14), slice(None))),
        ("left", 0.25, (slice(None), slice(0, 7))),
        ("right", 0.25, (slice(None), slice(21, 28))),
        ("bottom", 0.3, (slice(20, 28), slice(None))),  # ⌊0.3·28 + ½⌋ = 8 rows
        ("top", 1.0, (slice(None), slice(None))),
        ("right", 0.0, (slice(0, 0), slice(None))),
    ],
)
def test_image_region_is_exact(mode, fraction, region):
    x = _patterns(3, 784)
    out = corrupt(
        x,
        Corruption(mask=fraction, mask_mode=mode, fill=-2.0),
        generator=_gen(),
        item_shape=[1, 28, 28],
    )
    expected = torch.zeros(28, 28, dtype=torch.bool)
    expected[region] = True
    for row in out.hidden.view(3, 28, 28):
        assert torch.equal(row, expected)
    assert torch.all(out.queries[out.hidden] == -2.0)
    assert torch.equal(out.queries[~out.hidden], x[~out.hidden])


def test_rounding_is_half_up():
    x = _patterns(1, 2 * 3)  # a 2 × 3 image: 0.25 of 2 rows is 0.5 → 1 row
    out = corrupt(x, Corruption(mask=0.25, mask_mode="bottom"), generator=_gen(), item_shape=[2, 3])
    assert out.hidden.view(2, 3)[1].all() and not out.hidden.view(2, 3)[0].any()


def test_colour_images_hide_whole_pixels_in_every_channel():
    x = _patterns(4, 3 * 32 * 32)
    for mode in ("bottom", "random"):
        out = corrupt(
            x, Corruption(mask=0.5, mask_mode=mode), generator=_gen(), item_shape=(3, 32, 32)
        )
        hidden = out.hidden.view(4, 3, 32 * 32)
        assert torch.equal(hidden[:, 0], hidden[:, 1]) and torch.equal(hidden[:, 0], hidden[:, 2])
        assert hidden[:, 0].sum(dim=1).tolist() == [512] * 4


def test_random_pixels_differ_between_queries():
    x = _patterns(2, 784)
    out = corrupt(
        x, Corruption(mask=0.5, mask_mode="random"), generator=_gen(), item_shape=(1, 28, 28)
    )
    assert not torch.equal(out.hidden[0], out.hidden[1])


def test_default_mode_is_bottom_for_images_and_random_for_vectors():
    x = _patterns(2, 784)
    assert (
        corrupt(x, Corruption(mask=0.5), generator=_gen(), item_shape=(1, 28, 28)).mask_mode
        == "bottom"
    )
    assert corrupt(x, Corruption(mask=0.5), generator=_gen()).mask_mode == "random"


@pytest.mark.parametrize("sigma", [0.1, 0.5, 1.3])
def test_noise_has_the_asked_standard_deviation(sigma):
    x = _patterns(200, 784)
    out = corrupt(x, Corruption(noise=sigma), generator=_gen(3))
    noise = (out.queries - x).double()
    assert abs(noise.mean().item()) < 0.01 * max(sigma, 1)
    assert noise.std().item() == pytest.approx(sigma, rel=0.01)  # 156,800 draws: ±0.2 %


def test_mask_comes_before_noise():
    x = _patterns(100, 784)
    out = corrupt(
        x, Corruption(mask=0.5, fill=3.0, noise=0.5), generator=_gen(), item_shape=(1, 28, 28)
    )
    hidden_noise = out.queries[out.hidden].double() - 3.0  # fill, then noise on top
    assert hidden_noise.std().item() == pytest.approx(0.5, rel=0.02)
    assert abs(hidden_noise.mean().item()) < 0.01


def test_same_seed_same_queries_other_seed_other_queries():
    x = _patterns(10, 784)
    c = Corruption(mask=0.5, mask_mode="random", noise=0.3)
    a = corrupt(x, c, generator=_gen(7), item_shape=(1, 28, 28))
    b = corrupt(x, c, generator=_gen(7), item_shape=(1, 28, 28))
    other = corrupt(x, c, generator=_gen(8), item_shape=(1, 28, 28))
    assert torch.equal(a.queries, b.queries) and torch.equal(a.hidden, b.hidden)
    assert not torch.equal(a.queries, other.queries)
    assert not torch.equal(a.hidden, other.hidden)


def test_half_precision_patterns_are_corrupted_in_float32():
    x = _patterns(3, 16).to(torch.float16)
    out = corrupt(x, Corruption(noise=0.1), generator=_gen())
    assert out.queries.dtype == torch.float32


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"mask": 1.5}, "mask="),
        ({"mask": -0.1}, "mask="),
        ({"mask": math.nan}, "mask="),
        ({"noise": -1.0}, "noise="),
        ({"noise": math.inf}, "noise="),
        ({"fill": math.nan}, "fill="),
        ({"mask_mode": "middle"}, "mask_mode="),
    ],
)
def test_bad_settings_are_errors(kwargs, words):
    with pytest.raises(NphError, match=words):
        Corruption(**kwargs)


def test_region_mode_needs_an_image_memory():
    with pytest.raises(NphError, match="image"):
        corrupt(_patterns(2, 10), Corruption(mask=0.5, mask_mode="top"), generator=_gen())


def test_item_shape_must_match_the_dimension():
    with pytest.raises(NphError, match="item_shape"):
        corrupt(_patterns(2, 10), Corruption(mask=0.5), generator=_gen(), item_shape=(1, 28, 28))
