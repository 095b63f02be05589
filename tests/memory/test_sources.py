"""Sources: datasets through torchvision's real loaders, offline fallbacks, files, `random`."""

from __future__ import annotations

import gzip
import logging
import pickle
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from nphcli.core.errors import NphError
from nphcli.memory.file import save_memory
from nphcli.sources import SourceOptions, data_root, load_source, prepare_memory
from nphcli.sources import datasets as datasets_module
from nphcli.sources.base import choose
from nphcli.sources.sample import MNIST_FILES, sample_data_dir, unpack_idx

REPO = Path(__file__).resolve().parents[2]


# --- helpers ---------------------------------------------------------------------------------


def read_idx(path: Path) -> np.ndarray:
    """An independent IDX reader (gzip or plain), to check what torchvision returns."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def write_idx(path: Path, array: np.ndarray, *, compress: bool) -> None:
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(payload))
    else:
        path.write_bytes(payload)


def write_tiny_mnist_family(folder: Path, *, compress: bool, train: int = 6, test: int = 3):
    """Four IDX files with recognisable content: image i is filled with value 10·i."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", train), ("t10k", test)):
        images = np.stack([np.full((28, 28), 10 * i) for i in range(count)])
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images, compress=compress)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", np.arange(count) % 10, compress=compress)


def write_tiny_cifar(root: Path) -> dict[str, np.ndarray]:
    """CIFAR-10's python layout: 5 training batches, a test batch and batches.meta (pickles)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)  # 1024 R, 1024 G, 1024 B
        labels = rng.integers(0, 10, size=2).tolist()
        with open(folder / name, "wb") as handle:
            pickle.dump({"data": data, "labels": labels}, handle)
        rows[name] = (data, labels)
    with open(folder / "batches.meta", "wb") as handle:
        pickle.dump({"label_names": datasets_module.CIFAR10_CLASSES}, handle)
    return rows


@pytest.fixture
def empty_root(tmp_path, monkeypatch):
    """A data root without any dataset, and no Debian Fashion-MNIST either."""
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv("NPH_DATA", str(root))
    monkeypatch.setattr(datasets_module, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian")
    return root


# --- data root and subsets -------------------------------------------------------------------


def test_data_root_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("NPH_DATA", str(tmp_path / "env"))
    assert data_root(tmp_path / "flag") == (tmp_path / "flag", "--root")
    assert data_root(None) == (tmp_path / "env", "$NPH_DATA")
    monkeypatch.delenv("NPH_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert data_root(None)[0] == tmp_path / "cache" / "nph"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data_root(None)[0] == Path.home() / ".cache" / "nph"


def test_choose_is_seeded_sorted_and_without_replacement():
    first, selection = choose(100, 10, 3, what="x")
    again, _ = choose(100, 10, 3, what="x")
    other, _ = choose(100, 10, 4, what="x")
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.unique().numel() == 10 and torch.equal(first, first.sort().values)
    assert selection == {"method": "random_subset", "n": 10, "of": 100, "seed": 3}
    assert choose(5, None, 0, what="x") == (None, {"method": "all", "n": 5, "of": 5})


@pytest.mark.parametrize("n, message", [(0, "at least 1"), (-3, "at least 1"), (6, "more than")])
def test_choose_rejects_bad_n(n, message):
    with pytest.raises(NphError, match=message):
        choose(5, n, 0, what="x")


# --- MNIST family ----------------------------------------------------------------------------


def test_mnist_real_torchvision_loader_reads_bundled_sample_laid_out(tmp_path):
    unpack_idx(sample_data_dir() / "MNIST" / "raw", tmp_path, "MNIST")
    assert sorted(p.name for p in (tmp_path / "MNIST" / "raw").iterdir()) == sorted(MNIST_FILES)
    loaded = load_source("mnist", SourceOptions(root=tmp_path))
    assert loaded.patterns.shape == (5000, 784) and loaded.patterns.dtype == torch.float32
    assert loaded.meta["fallback"] is False
    assert loaded.meta["origin"] == f"torchvision.datasets.MNIST at {tmp_path}"
    assert loaded.meta["item_shape"] == [1, 28, 28] and loaded.meta["split"] == "train"
    expected = read_idx(sample_data_dir() / "MNIST" / "raw" / "train-images-idx3-ubyte.gz")
    assert torch.equal(
        loaded.patterns, torch.from_numpy(expected.reshape(5000, 784).copy()).float()
    )
    assert loaded.labels[:12].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    test = load_source("mnist", SourceOptions(root=tmp_path, split="test"))
    assert test.labels.tolist()[:10] == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]


def test_mnist_falls_back_to_bundled_digits(empty_root, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="nph"):
        loaded = load_source("mnist", SourceOptions(n=100, seed=1))
    assert "bundled with nph" in caplog.text and str(empty_root) in caplog.text
    assert loaded.meta["fallback"] is True and "bundled" in loaded.meta["origin"]
    assert loaded.meta["selection"] == {"method": "random_subset", "n": 100, "of": 5000, "seed": 1}
    assert loaded.patterns.shape == (100, 784) and loaded.labels.shape == (100,)
    # The fallback is the same data torchvision reads from the laid-out sample.
    unpack_idx(sample_data_dir() / "MNIST" / "raw", tmp_path / "laid", "MNIST")
    direct = load_source("mnist", SourceOptions(n=100, seed=1, root=tmp_path / "laid"))
    assert torch.equal(direct.patterns, loaded.patterns)
    assert torch.equal(direct.labels, loaded.labels)


def test_mnist_test_split_fallback_has_20_digits(empty_root):
    loaded = load_source("mnist", SourceOptions(split="test"))
    assert loaded.patterns.shape == (20, 784) and loaded.meta["split"] == "test"
    with pytest.raises(NphError, match="--download or --root"):
        load_source("mnist", SourceOptions(split="test", n=21))


def test_fashion_mnist_from_root_and_from_debian(empty_root, tmp_path, monkeypatch, caplog):
    write_tiny_mnist_family(empty_root / "FashionMNIST" / "raw", compress=False)
    loaded = load_source("fashion-mnist", SourceOptions())
    assert loaded.meta["fallback"] is False and loaded.patterns.shape == (6, 784)
    assert loaded.patterns[:, 0].tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    assert loaded.meta["classes"][0] == "T-shirt/top"

    debian = tmp_path / "debian"
    write_tiny_mnist_family(debian, compress=True, train=4)
    monkeypatch.setattr(datasets_module, "DEBIAN_FASHION_MNIST", debian)
    with caplog.at_level(logging.WARNING, logger="nph"):
        fallback = load_source("fashion-mnist", SourceOptions(root=tmp_path / "nothing"))
    assert fallback.meta["fallback"] is True and "dataset-fashion-mnist" in fallback.meta["origin"]
    assert fallback.patterns.shape == (4, 784) and "dataset-fashion-mnist" in caplog.text
    assert (
        load_source("fashion-mnist", SourceOptions(root=tmp_path / "x", split="test")).meta[
            "available"
        ]
        == 3
    )


def test_fashion_mnist_missing_everywhere_is_a_clear_error(empty_root):
    with pytest.raises(NphError, match="dataset-fashion-mnist.*--download|--download.*Debian"):
        load_source("fashion-mnist", SourceOptions())


# --- CIFAR-10 --------------------------------------------------------------------------------


def test_cifar10_real_torchvision_loader_on_tiny_batches(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    rows = write_tiny_cifar(tmp_path)
    # As torchvision's own tests do: the fixed md5 sums cannot match fake batches.
    monkeypatch.setattr(cifar.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    loaded = load_source("cifar10", SourceOptions(root=tmp_path))
    assert loaded.meta["fallback"] is False and str(tmp_path) in loaded.meta["origin"]
    assert loaded.patterns.shape == (10, 3072) and loaded.meta["item_shape"] == [3, 32, 32]
    # Rows of the batches are (R plane, G plane, B plane), the same CHW order nph stores.
    first, labels = rows["data_batch_1"]
    assert torch.equal(loaded.patterns[:2], torch.from_numpy(first).float())
    assert loaded.labels[:2].tolist() == labels
    test = load_source("cifar10", SourceOptions(root=tmp_path, split="test"))
    assert torch.equal(test.patterns, torch.from_numpy(rows["test_batch"][0]).float())
    assert test.meta["classes"] == datasets_module.CIFAR10_CLASSES


def test_cifar10_falls_back_to_20_bundled_test_images(empty_root, caplog):
    with caplog.at_level(logging.WARNING, logger="nph"):
        loaded = load_source("cifar10", SourceOptions())
    assert loaded.patterns.shape == (20, 3072) and loaded.meta["split"] == "test"
    assert loaded.meta["fallback"] is True and "20" in caplog.text
    assert loaded.labels.tolist()[:5] == [3, 8, 8, 0, 6]
    bundle = np.load(sample_data_dir() / "cifar10_test_first20.npz")
    chw = torch.from_numpy(bundle["x"]).permute(0, 3, 1, 2).reshape(20, -1).float()
    assert torch.equal(loaded.patterns, chw)
    with pytest.raises(NphError, match="--root.*--download"):
        load_source("cifar10", SourceOptions(n=21))


def test_download_failure_is_a_user_error_and_keeps_stdout_clean(tmp_path, monkeypatch, capsys):
    import torchvision.datasets.mnist as mnist

    def offline(self):
        print("Downloading https://example.invalid/train-images-idx3-ubyte.gz")
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz: no network")

    monkeypatch.setattr(mnist.MNIST, "download", offline)
    with pytest.raises(NphError, match="could not download MNIST"):
        load_source("mnist", SourceOptions(root=tmp_path, download=True))
    assert capsys.readouterr().out == ""


# --- random ----------------------------------------------------------------------------------


def test_random_is_seeded_and_has_the_asked_distribution():
    a = load_source("random", SourceOptions(n=50, dim=8, seed=5))
    b = load_source("random", SourceOptions(n=50, dim=8, seed=5))
    assert torch.equal(a.patterns, b.patterns) and a.patterns.shape == (50, 8)
    assert a.labels is None and a.meta["kind"] == "vector"
    binary = load_source("random", SourceOptions(n=50, dim=8, distribution="binary"))
    assert set(binary.patterns.unique().tolist()) == {-1.0, 1.0}
    default = load_source("random", SourceOptions())
    assert default.patterns.shape == (1000, 64)
    with pytest.raises(NphError, match="--dim"):
        load_source("random", SourceOptions(dim=0))


def test_options_a_source_does_not_use_are_errors():
    with pytest.raises(NphError, match="--dim does not apply to mnist"):
        load_source("mnist", SourceOptions(dim=3))
    with pytest.raises(NphError, match="--split does not apply to random"):
        load_source("random", SourceOptions(split="test"))


def test_unknown_source_and_file_type(tmp_path):
    with pytest.raises(NphError, match="unknown source 'nope'"):
        load_source("nope")
    (tmp_path / "data.xyz").write_text("1,2\n")
    with pytest.raises(NphError, match="unsupported file type '.xyz'"):
        load_source(str(tmp_path / "data.xyz"))


# --- files -----------------------------------------------------------------------------------


def test_npy_rows_and_image_stacks(tmp_path):
    np.save(tmp_path / "v.npy", np.arange(12, dtype=np.float64).reshape(4, 3))
    loaded = load_source(str(tmp_path / "v.npy"))
    assert loaded.patterns.tolist()[1] == [3.0, 4.0, 5.0] and loaded.meta["kind"] == "vector"
    assert "item_shape" not in loaded.meta
    np.save(tmp_path / "img.npy", np.zeros((5, 4, 6), dtype=np.uint8))
    images = load_source(str(tmp_path / "img.npy"))
    assert images.patterns.shape == (5, 24) and images.meta["item_shape"] == [1, 4, 6]
    assert images.meta["kind"] == "image" and images.meta["pixel_range"] == [0, 255]


@pytest.mark.parametrize(
    "array, message",
    [
        (np.array([[1.0, np.nan]]), "NaN or infinite.*row 1, column 2"),
        (np.array([[1.0], [np.inf]]), "row 2, column 1"),
        (np.arange(3.0), "shape"),
        (np.zeros((0, 3)), "shape"),
        (np.array([["a", "b"]]), "numbers only"),
        (np.array([[1j]]), "numbers only"),
    ],
)
def test_npy_bad_arrays(tmp_path, array, message):
    np.save(tmp_path / "bad.npy", array)
    with pytest.raises(NphError, match=message):
        load_source(str(tmp_path / "bad.npy"))


def test_npy_object_arrays_are_never_unpickled(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(NphError, match="cannot read"):
        load_source(str(tmp_path / "obj.npy"))


def test_npz_key_selection(tmp_path):
    np.savez(tmp_path / "one.npz", x=np.ones((2, 3)))
    assert load_source(str(tmp_path / "one.npz")).meta["key"] == "x"
    np.savez(tmp_path / "two.npz", x=np.ones((2, 3)), y=np.zeros(2))
    with pytest.raises(NphError, match=r"several arrays \(x, y\).*--key"):
        load_source(str(tmp_path / "two.npz"))
    picked = load_source(str(tmp_path / "two.npz"), SourceOptions(key="x"))
    assert picked.patterns.shape == (2, 3)
    with pytest.raises(NphError, match="no array 'z'; it has: x, y"):
        load_source(str(tmp_path / "two.npz"), SourceOptions(key="z"))


def test_safetensors_key_and_nph_memory_files(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"a": torch.ones(2, 3), "b": torch.zeros(4, 3, dtype=torch.bfloat16)}, str(path))
    with pytest.raises(NphError, match="--key"):
        load_source(str(path))
    assert load_source(str(path), SourceOptions(key="b")).patterns.shape == (4, 3)
    memory = save_memory(
        tmp_path / "m.safetensors",
        torch.rand(6, 4),
        labels=torch.arange(6),
        meta={"item_shape": [1, 2, 2]},
    )
    again = load_source(str(memory), SourceOptions(n=3))
    assert again.patterns.shape == (3, 4) and again.labels.shape == (3,)
    assert again.meta["item_shape"] == [1, 2, 2]


def test_pt_weights_only(tmp_path):
    torch.save(torch.arange(6.0).reshape(2, 3), tmp_path / "t.pt")
    assert load_source(str(tmp_path / "t.pt")).patterns.shape == (2, 3)
    torch.save({"w": torch.ones(3, 2), "step": 7}, tmp_path / "d.pt")
    assert load_source(str(tmp_path / "d.pt")).meta["key"] == "w"


class Payload:
    """A pickled object that must never be instantiated by loading."""

    def __reduce__(self):
        return (sys.exit, ("unpickled!",))


def test_pt_arbitrary_objects_are_refused(tmp_path):
    torch.save({"x": Payload()}, tmp_path / "evil.pt")
    with pytest.raises(NphError, match="weights_only=True"):
        load_source(str(tmp_path / "evil.pt"))


def test_csv_with_and_without_header(tmp_path):
    (tmp_path / "h.csv").write_text("a, b ,c\n1,2,3\n\n4,5,6.5\n")
    loaded = load_source(str(tmp_path / "h.csv"))
    assert loaded.patterns.tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.5]]
    assert loaded.meta["columns"] == ["a", "b", "c"]
    (tmp_path / "plain.csv").write_text("1,2\n3,4\n")
    assert load_source(str(tmp_path / "plain.csv")).patterns.tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    "text, message",
    [
        ("1,2\n3,x\n", r"line 2, column 2: 'x' is not a number"),
        ("1,2\n3,4,5\n", "line 2 has 3 values, but line 1 has 2"),
        ("a,b\n1,2\n3\n", "line 3 has 1 values, but line 1 has 2"),
        ("1,2\n\n3,nan\n", "NaN or infinite.*line 3"),
        ("a,b\n", "no rows of numbers"),
    ],
)
def test_csv_errors_name_the_line(tmp_path, text, message):
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(NphError, match=message):
        load_source(str(tmp_path / "bad.csv"))


def _picture(path: Path, size: tuple[int, int], mode: str = "L", value: int = 100) -> None:
    Image.new(mode, size, value if mode == "L" else (value, 0, 255 - value)).save(path)


def test_image_folder(tmp_path):
    folder = tmp_path / "pics"
    folder.mkdir()
    _picture(folder / "b.png", (4, 3), value=200)
    _picture(folder / "a.png", (4, 3), value=10)
    (folder / ".hidden").write_text("ignored")
    loaded = load_source(str(folder))
    assert loaded.patterns.shape == (2, 12) and loaded.meta["item_shape"] == [1, 3, 4]
    assert loaded.patterns[:, 0].tolist() == [10.0, 200.0]  # file-name order
    _picture(folder / "c.jpg", (4, 3), mode="RGB")
    colour = load_source(str(folder))
    assert colour.meta["item_shape"] == [3, 3, 4] and colour.patterns.shape == (3, 36)


def test_image_folder_sizes_and_non_images(tmp_path):
    folder = tmp_path / "pics"
    folder.mkdir()
    _picture(folder / "a.png", (4, 3))
    _picture(folder / "b.png", (8, 8))
    with pytest.raises(NphError, match="a.png is 4x3, b.png is 8x8.*--size"):
        load_source(str(folder))
    resized = load_source(str(folder), SourceOptions(size="5x2"))
    assert resized.meta["item_shape"] == [1, 2, 5]
    with pytest.raises(NphError, match="WxH"):
        load_source(str(folder), SourceOptions(size="5by2"))
    (folder / "notes.txt").write_text("hello")
    with pytest.raises(NphError, match="notes.txt is not a PNG or JPEG"):
        load_source(str(folder))
    (folder / "notes.txt").unlink()
    (folder / "broken.png").write_bytes(b"not a png")
    with pytest.raises(NphError, match="cannot read image .*broken.png"):
        load_source(str(folder))


# --- prepare_memory and packaging ------------------------------------------------------------


def test_prepare_memory_default_normalisation_and_dtype(empty_root):
    mnist = prepare_memory("mnist", SourceOptions(n=10), dtype="float16")
    assert mnist.patterns.dtype == torch.float16 and mnist.meta["normalize"]["method"] == "centered"
    low, high = mnist.meta["value_range"]
    assert -0.5 <= low and high <= 0.5
    vectors = prepare_memory("random", SourceOptions(n=4, dim=3, distribution="binary"))
    assert vectors.meta["normalize"]["method"] == "none"
    assert set(vectors.patterns.unique().tolist()) == {-1.0, 1.0}


def test_prepare_memory_rejects_values_that_overflow_the_dtype(tmp_path):
    np.save(tmp_path / "big.npy", np.full((2, 2), 1e6))
    with pytest.raises(NphError, match="do not fit in float16"):
        prepare_memory(str(tmp_path / "big.npy"), dtype="float16")


def test_every_subpackage_is_in_the_wheel_package_list():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "nphcli").rglob("__init__.py")
    }
    assert found <= listed, f"add {sorted(found - listed)} to [tool.setuptools] packages"
    assert config["package-dir"]["nphcli.sample_data"] == "sample_data"


def test_package_data_globs_cover_the_sample_data():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = config["package-data"]["nphcli.sample_data"]
    folder = REPO / "sample_data"
    shipped = {p for pattern in globs for p in folder.glob(pattern)}
    assert shipped == {p for p in folder.rglob("*") if p.is_file()}
    assert sample_data_dir().resolve() in (folder.resolve(), (REPO / "nphcli" / "sample_data"))


def test_damaged_dataset_files_are_a_clear_error(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        (raw / name).write_bytes(b"\x00\x00\x08\x09 not idx")
    with pytest.raises(NphError, match="could not read MNIST .*damaged.*--download"):
        load_source("mnist", SourceOptions(root=tmp_path))
