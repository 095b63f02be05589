"""`host_buffers.empty` stands in for `torch.empty`: the shape, dtype and device asked for, with
every element writable and read back exactly, on either side of the huge-page threshold and for
dtypes numpy lacks (bfloat16); `word_dtype` is the integer of a float's size."""

from __future__ import annotations

import pytest
import torch

from nphcli.engine import host_buffers


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [3, 2048], ids=["small", "huge-pages"])
def test_empty_is_a_writable_tensor_of_the_shape_and_dtype(dtype, rows):
    buffer = host_buffers.empty((rows, 1024), dtype)
    assert buffer.shape == (rows, 1024) and buffer.dtype == dtype and buffer.device.type == "cpu"
    huge = rows * 1024 * buffer.element_size() >= host_buffers.HUGE_PAGE_MIN_BYTES
    assert huge == (rows == 2048)  # each case is on the side of the threshold it names
    values = torch.arange(rows * 1024, dtype=torch.float64).remainder(251).reshape(rows, 1024)
    buffer.copy_(values)
    torch.testing.assert_close(buffer.double(), values, rtol=0, atol=0)


def test_empty_off_the_cpu_is_torchs():
    buffer = host_buffers.empty((2048, 1024), torch.float32, "meta")
    assert buffer.device.type == "meta" and buffer.shape == (2048, 1024)


@pytest.mark.parametrize(
    ("dtype", "word"),
    [(torch.bfloat16, torch.int16), (torch.float32, torch.int32), (torch.float64, torch.int64)],
)
def test_word_dtype_is_the_integer_of_the_same_size(dtype, word):
    assert host_buffers.word_dtype(dtype) == word
