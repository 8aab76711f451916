"""IDX files (MNIST, Fashion-MNIST): header checks and md5 of the uncompressed content against canonical values."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from privdl.data.datasets import DATASETS, Dataset
from privdl.data.files import check_digest, find_file, read_bytes
from privdl.errors import DataError

# md5 of the uncompressed IDX files (the canonical values most loaders check)
MNIST_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
FASHION_MD5 = {
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}
FASHION_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")


def parse_idx(data: bytes, path: Path | str = "<bytes>") -> np.ndarray:
    """Parse IDX bytes (magic 2049 labels / 2051 images, unsigned bytes) into an array."""
    if len(data) < 8:
        raise DataError(f"{path} is too short to be an IDX file")
    magic = int.from_bytes(data[:4], "big")
    if magic not in (2049, 2051):
        raise DataError(f"{path} is not an IDX label/image file (magic {magic}, expected 2049 or 2051)")
    ndim = magic - 2048
    dims = [int.from_bytes(data[4 + 4 * k: 8 + 4 * k], "big") for k in range(ndim)]
    offset = 4 + 4 * ndim
    expected = int(np.prod(dims))
    if len(data) - offset != expected:
        raise DataError(f"{path}: header says {dims} ({expected} bytes) but the file holds {len(data) - offset}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def _load(name: str, checksums: dict[str, str], subdirs: list[str], extra: list[Path], data_dir: str | None,
          verify: bool, what: str) -> np.ndarray:
    path = find_file([name], subdirs, f"{what} {name}", data_dir, extra)
    raw = read_bytes(path)
    if verify:
        check_digest(raw, path, md5=checksums[name])
    return parse_idx(raw, path)


def _idx_dataset(label: str, checksums: dict[str, str], subdirs: list[str], extra: list[Path],
                 data_dir: str | None, verify: bool) -> Dataset:
    arrays = {k: _load(k, checksums, subdirs, extra, data_dir, verify, label) for k in checksums}
    to_x = lambda a: (a.astype(np.float32) / 255.0)[:, None, :, :]  # noqa: E731  (N, 1, 28, 28)
    return Dataset(
        label,
        to_x(arrays["train-images-idx3-ubyte"]), arrays["train-labels-idx1-ubyte"].astype(np.int64),
        to_x(arrays["t10k-images-idx3-ubyte"]), arrays["t10k-labels-idx1-ubyte"].astype(np.int64),
        10, source=f"IDX files ({label})",
    )


@DATASETS.register("mnist")
def mnist(*, data_dir: str | None = None, verify: bool = True) -> Dataset:
    """MNIST from the four IDX files (optionally .gz) under <data root>/mnist/. Pixels scaled to [0, 1]."""
    return _idx_dataset("mnist", MNIST_MD5, ["mnist"], [], data_dir, verify)


@DATASETS.register("fashion_mnist")
def fashion_mnist(*, data_dir: str | None = None, verify: bool = True) -> Dataset:
    """Fashion-MNIST from the IDX files: <data root>/fashion-mnist/ or the Debian package dataset-fashion-mnist
    (/usr/share/datasets/fashion-mnist/; ``apt-get install dataset-fashion-mnist``)."""
    return _idx_dataset("fashion_mnist", FASHION_MD5, ["fashion-mnist", "fashion_mnist"], [FASHION_SYSTEM_DIR],
                        data_dir, verify)


@DATASETS.register("mnist_t10k")
def mnist_t10k(*, data_dir: str | None = None, verify: bool = True, train_size: int = 5000) -> Dataset:
    """MNIST's test split alone (for machines that lack the training images, like this project's CI): its first
    ``train_size`` images for training, the rest for testing. Real MNIST digits (seed 004's audit uses them)."""
    names = {k: MNIST_MD5[k] for k in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
    arrays = {k: _load(k, names, ["mnist"], [], data_dir, verify, "mnist") for k in names}
    X = (arrays["t10k-images-idx3-ubyte"].astype(np.float32) / 255.0)[:, None, :, :]
    y = arrays["t10k-labels-idx1-ubyte"].astype(np.int64)
    if not 0 < train_size < len(y):
        raise DataError(f"train_size must be in (0, {len(y)}), got {train_size}")
    return Dataset("mnist_t10k", X[:train_size], y[:train_size], X[train_size:], y[train_size:], 10,
                   source="MNIST t10k IDX files split in two")
