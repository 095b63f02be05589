"""One comparison picture for many settings (`--save-grid`, `save_comparison_grid`): its layout
read back from the pixels (grey gutter lines between tiles, a white label band on the right)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import write_memory
from PIL import Image

from nphcli.evaluation.corruption import Corruption
from nphcli.evaluation.evaluate import evaluate
from nphcli.memory import open_memory
from nphcli.presentation.comparison_image import GUTTER, save_comparison_grid
from nphcli.schema.settings import RetrieveSettings

GREY = round(GUTTER * 255)


def _memory(tmp_path, shape, *, values=None, name="m.safetensors"):
    count = 12
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(count, int(np.prod(shape)), generator=generator)
    meta = {"kind": "image", "item_shape": list(shape)}
    path = tmp_path / name
    write_memory(path, images, meta=meta, values=None if values is None else values(images))
    return path


def _runs(true: np.ndarray) -> int:
    """How many runs of True `true` holds."""
    padded = np.concatenate([[False], true, [False]]).astype(int)
    return int((np.diff(padded) == 1).sum())


def layout(path) -> tuple[int, int, bool]:
    """(tile rows, tile columns, a label band with text) read from the picture's pixels."""
    image = np.asarray(Image.open(path).convert("L")).astype(int)  # (H, W)
    grey_columns = np.all(image == GREY, axis=0)  # vertical gutter lines (and tile-free band)
    last_gutter = np.nonzero(grey_columns)[0].max()
    tiles = image[:, : last_gutter + 1]
    band = image[:, last_gutter + 1 :]
    rows = _runs(~np.all(tiles == GREY, axis=1))
    columns = _runs(~np.all(tiles == GREY, axis=0))
    has_text = band.size > 0 and (band == 255).mean() > 0.8 and (band < 100).any()
    return rows, columns, bool(has_text)


def test_one_setting_keeps_three_rows(invoke, tmp_path):
    memory = _memory(tmp_path, (1, 28, 28))
    out = tmp_path / "one.png"
    result = invoke("retrieve", "--memory", memory, "--queries", "5", "--save-grid", out)
    assert result.exit_code == 0, result.stderr
    assert layout(out) == (3, 5, True)


def test_many_settings_draw_one_row_each_between_queries_and_targets(invoke, tmp_path):
    memory = _memory(tmp_path, (1, 28, 28))
    out = tmp_path / "many.png"
    result = invoke(
        "retrieve", "--memory", memory, "--model", "dense,sparse,topk", "--k", "3",
        "--mask", "0.5", "--queries", "4", "--save-grid", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "sparse" in result.stdout  # the comparison table is still printed
    assert layout(out) == (1 + 3 + 1, 4, True)


def test_each_corruption_gets_its_query_row(invoke, tmp_path):
    memory = _memory(tmp_path, (1, 28, 28))
    out = tmp_path / "masks.png"
    result = invoke(
        "retrieve", "--memory", memory, "--model", "dense,topk", "--k", "3",
        "--mask", "0.25,0.5", "--queries", "3", "--save-grid", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert layout(out) == (2 + 4 + 1, 3, True)


def test_colour_images_stay_colour(tmp_path):
    path = _memory(tmp_path, (3, 32, 32))
    memory = open_memory(path)
    reports = [
        evaluate(memory, RetrieveSettings(model=m, queries=6, corruption=Corruption(noise=0.2)))
        for m in ("dense", "sparse")
    ]
    out = save_comparison_grid(tmp_path / "c.png", reports, memory, count=6)
    image = Image.open(out)
    assert image.mode == "RGB"
    pixels = np.asarray(image).astype(int)
    assert (np.abs(pixels[..., 0] - pixels[..., 1]) > 10).any()  # not grey
    assert layout(out) == (4, 6, True)


@pytest.mark.parametrize(
    ("values", "item"),
    [
        (lambda images: images.flip(1), (28, 28)),  # values are images of the keys' shape
        (lambda images: images[:, :50] * 3 - 1, (7, 8)),  # vectors of 50: 7 × 8 blocks
    ],
)
def test_hetero_values_are_drawn(tmp_path, values, item):
    path = _memory(tmp_path, (1, 28, 28), values=values)
    memory = open_memory(path)
    reports = [evaluate(memory, RetrieveSettings(model=m, queries=4)) for m in ("dense", "topk")]
    out = save_comparison_grid(tmp_path / "h.png", reports, memory, count=4, scale=1, pad=2)
    assert layout(out) == (4, 4, True)
    image = np.asarray(Image.open(out).convert("L")).astype(int)
    cell = image[32:60, 2:30]  # the first setting's first cell (row 1: 2 + 28 + 2 down)
    height, width = item
    assert len(np.unique(cell[:height, :width])) > 10  # drawn values, not a flat fill
    assert (cell[height:, :] == 255).all() and (cell[:, width:] == 255).all()


def test_settings_on_different_queries_are_refused(tmp_path):
    from nphcli.core.errors import NphError

    path = _memory(tmp_path, (1, 28, 28))
    memory = open_memory(path)
    reports = [evaluate(memory, RetrieveSettings(queries=4, seed=s)) for s in (0, 1)]
    with pytest.raises(NphError, match="same queries"):
        save_comparison_grid(tmp_path / "x.png", reports, memory)
    assert not (tmp_path / "x.png").exists()


def test_out_still_takes_one_setting(invoke, tmp_path):
    memory = _memory(tmp_path, (1, 28, 28))
    result = invoke(
        "retrieve", "--memory", memory, "--model", "dense,topk",
        "--out", tmp_path / "r.safetensors", "--save-grid", tmp_path / "g.png",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--out takes one setting" in result.stderr
    assert not (tmp_path / "g.png").exists()
