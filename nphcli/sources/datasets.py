"""Image datasets read with torchvision's own dataset classes: mnist, fashion-mnist, cifar10.

Nothing is downloaded without `--download`. A dataset not on disk falls back, with a notice, to
real data reachable offline (docs/memory-files.md): the bundled MNIST digits and CIFAR-10 test
images (sample_data/), or Debian's dataset-fashion-mnist files; the MNIST-family files are read
by torchvision itself from a temporary folder in its layout. CIFAR-10's batches are unpickled
only after torchvision checks their fixed md5 sums.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from pathlib import Path
from typing import Any

from nphcli.core.errors import NphError
from nphcli.core.notices import notice
from nphcli.sources import sample
from nphcli.sources.base import IMAGE, Loaded, SourceOptions, choose, register_source
from nphcli.sources.vision import first_line, import_torchvision

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
CIFAR10_CLASSES = "airplane automobile bird cat deer dog frog horse ship truck".split()
SPLITS = ("train", "test")


def data_root(root: Path | str | None = None) -> tuple[Path, str]:
    """The dataset root and where it came from: `--root`, `$NPH_DATA`, or the cache folder."""
    if root is not None:
        return Path(root).expanduser(), "--root"
    env = os.environ.get("NPH_DATA")
    if env:
        return Path(env).expanduser(), "$NPH_DATA"
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache"
    return base / "nph", "the per-user cache folder"


@register_source(
    "mnist",
    summary="MNIST digits (1x28x28) via torchvision; offline fallback: 5,000 bundled real digits",
    options=("split", "root", "download"),
)
def load_mnist(spec: str, options: SourceOptions) -> Loaded:
    return _mnist_family(spec, options, cls_name="MNIST", label="MNIST")


@register_source(
    "fashion-mnist",
    summary="Fashion-MNIST (1x28x28) via torchvision; offline: Debian's dataset-fashion-mnist",
    options=("split", "root", "download"),
)
def load_fashion_mnist(spec: str, options: SourceOptions) -> Loaded:
    return _mnist_family(spec, options, cls_name="FashionMNIST", label="Fashion-MNIST")


@register_source(
    "cifar10",
    summary="CIFAR-10 (3x32x32) via torchvision; offline fallback: 20 bundled real test images",
    options=("split", "root", "download"),
)
def load_cifar10(spec: str, options: SourceOptions) -> Loaded:
    import numpy as np
    import torch

    CIFAR10 = import_torchvision().CIFAR10
    split = _split(options)
    root, how = data_root(options.root)
    dataset = _open(CIFAR10, root, split, options.download, "CIFAR-10")
    if dataset is not None:
        images = torch.from_numpy(dataset.data).permute(0, 3, 1, 2)  # (N, 3, 32, 32)
        labels = torch.tensor(dataset.targets, dtype=torch.int64)
        origin = f"torchvision.datasets.CIFAR10 at {root}"
        return _images(spec, images, labels, options, split, origin, False, dataset.classes)

    if options.n is not None and options.n > sample.CIFAR10_COUNT:
        raise NphError(
            f"CIFAR-10 was not found under {root / 'cifar-10-batches-py'} (root from {how}), "
            f"and nph bundles only {sample.CIFAR10_COUNT} real CIFAR-10 test images, fewer than "
            f"--n {options.n}; pass --root DIR with the dataset in DIR/cifar-10-batches-py, or "
            "--download to fetch it (about 170 MB)"
        )
    with np.load(sample.sample_data_dir() / sample.CIFAR10_FILE, allow_pickle=False) as bundle:
        images = torch.from_numpy(bundle["x"]).permute(0, 3, 1, 2)  # (20, 3, 32, 32)
        labels = torch.from_numpy(bundle["y"]).to(torch.int64)
    instead = " instead of the training set" if split == "train" else ""
    notice(
        f"CIFAR-10 not found under {root / 'cifar-10-batches-py'} (root from {how}); using the "
        f"{sample.CIFAR10_COUNT} real CIFAR-10 test images bundled with nph{instead}. For the "
        "full dataset pass --download, or --root DIR holding cifar-10-batches-py/"
    )
    origin = f"nph bundled sample: the first {sample.CIFAR10_COUNT} CIFAR-10 test images"
    return _images(spec, images, labels, options, "test", origin, True, CIFAR10_CLASSES)


def _mnist_family(spec: str, options: SourceOptions, *, cls_name: str, label: str) -> Loaded:
    cls = getattr(import_torchvision(), cls_name)
    split = _split(options)
    root, how = data_root(options.root)
    dataset = _open(cls, root, split, options.download, label)
    if dataset is not None:
        origin = f"torchvision.datasets.{cls_name} at {root}"
        images = dataset.data.unsqueeze(1)  # (N, 1, 28, 28)
        classes = list(dataset.classes)
        return _images(spec, images, dataset.targets, options, split, origin, False, classes)

    missing = f"{label} not found under {root / cls_name / 'raw'} (root from {how})"
    if cls_name == "MNIST":
        offline = sample.sample_data_dir() / "MNIST" / "raw"
        count = sample.MNIST_TRAIN_COUNT if split == "train" else sample.MNIST_TEST_COUNT
        what = "training digits" if split == "train" else "test digits"
        origin = f"nph bundled sample: {count:,} real MNIST {what}"
        message = (
            f"{missing}; using the {count:,} real MNIST {what} bundled with nph. For the full "
            f"dataset pass --download, or --root DIR holding MNIST/raw/"
        )
    else:
        offline = DEBIAN_FASHION_MNIST
        if not all((offline / f"{name}.gz").is_file() for name in sample.MNIST_FILES):
            raise NphError(
                f"{missing}, and Debian's dataset-fashion-mnist files are not in {offline}; "
                "pass --download to fetch it, --root DIR holding FashionMNIST/raw/, or install "
                "the Debian package dataset-fashion-mnist"
            )
        origin = f"Debian package dataset-fashion-mnist ({offline})"
        message = f"{missing}; using Debian's dataset-fashion-mnist files in {offline}"

    with tempfile.TemporaryDirectory(prefix="nph-") as tmp:  # it holds all four files
        dataset = _open(cls, sample.unpack_idx(offline, Path(tmp), cls_name), split, False, label)
    # Check --n before the notice, so that a failing command prints one line.
    what = f"the data nph found offline ({missing}; pass --download or --root for all of it)"
    chosen = choose(len(dataset.data), options.n, options.seed, what=what)
    notice(message)
    images = dataset.data.unsqueeze(1)  # (N, 1, 28, 28)
    classes = list(dataset.classes)
    return _images(spec, images, dataset.targets, options, split, origin, True, classes, chosen)


def _split(options: SourceOptions) -> str:
    split = options.split or "train"
    if split not in SPLITS:
        raise NphError(f"--split must be one of {', '.join(SPLITS)}, got {split!r}")
    return split


def _open(cls: Any, root: Path, split: str, download: bool, label: str) -> Any | None:
    """Open a torchvision dataset; None when it is not on disk and download was not asked for."""
    train = split == "train"
    if not download:
        try:
            return cls(str(root), train=train, download=False)
        except RuntimeError as error:
            if "not found" in str(error):
                return None
            raise _damaged(label, root, error) from None
        except (OSError, ValueError, AssertionError, EOFError) as error:
            raise _damaged(label, root, error) from None
    # torchvision reports download progress with print(); stdout is for results only.
    try:
        with contextlib.redirect_stdout(_NoticeWriter()):
            return cls(str(root), train=train, download=True)
    except Exception as error:  # network, disk and archive errors all mean the same to the user
        raise NphError(
            f"could not download {label} into {root}: {first_line(error)}. Check the network, "
            "or run without --download to use the data nph can find offline"
        ) from None


def _damaged(label: str, root: Path, error: Exception) -> NphError:
    return NphError(
        f"could not read {label} under {root} ({first_line(error)}); the files there look damaged: "
        "replace them, or pass --download to fetch them again"
    )


class _NoticeWriter(io.TextIOBase):
    """A stdout stand-in that turns each printed line into a notice."""

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.strip():
                notice(line.strip())
        return len(text)


def _images(spec, images, labels, options, split, origin, fallback, classes, chosen=None):
    """Images (N, C, H, W) uint8 and labels (N,) as Loaded; `chosen`: the subset, else chosen."""
    import torch

    available = images.shape[0]
    indices, selection = chosen or choose(available, options.n, options.seed, what=origin)
    if indices is not None:
        images, labels = images[indices], labels[indices]
    patterns = images.reshape(images.shape[0], -1).to(torch.float32)  # (M, C*H*W)
    meta = {
        "source": spec,
        "kind": IMAGE,
        "split": split,
        "item_shape": list(images.shape[1:]),
        "pixel_range": [0, 255],
        "origin": origin,
        "fallback": fallback,
        "available": available,
        "selection": selection,
        "seed": options.seed,
        "classes": classes,
    }
    return Loaded(patterns, torch.as_tensor(labels, dtype=torch.int64), meta)
