"""The real images that ship with nph (the repository's sample_data/ folder).

A wheel carries them as the package `nphcli.sample_data` (see pyproject.toml); a source checkout
or editable install reads sample_data/ beside the package. Never anything outside the project.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from nphcli.core.errors import NphRuntimeError

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
MNIST_TRAIN_COUNT = 5000
MNIST_TEST_COUNT = 20
CIFAR10_FILE = "cifar10_test_first20.npz"
CIFAR10_COUNT = 20

_PACKAGE = Path(__file__).resolve().parents[1]  # nphcli/


def sample_data_dir() -> Path:
    """The folder holding the bundled sample data, installed or in a source checkout."""
    for candidate in (_PACKAGE / "sample_data", _PACKAGE.parent / "sample_data"):
        if (candidate / "MNIST" / "raw" / f"{MNIST_FILES[0]}.gz").is_file():
            return candidate
    raise NphRuntimeError(
        "nph's bundled sample data is missing (looked in "
        f"{_PACKAGE / 'sample_data'} and {_PACKAGE.parent / 'sample_data'}); reinstall nph"
    )


def unpack_idx(source: Path, root: Path, folder: str) -> Path:
    """Decompress the four `*.gz` IDX files in `source` into `root/folder/raw/`, where (and how)
    torchvision's MNIST-family loaders read them. Returns `root`."""
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name in MNIST_FILES:
        with gzip.open(source / f"{name}.gz", "rb") as packed, open(raw / name, "wb") as out:
            shutil.copyfileobj(packed, out)
    return root
