"""CIFAR-100 from the python pickles of the official archive (``cifar-100-python/train`` and ``test``)."""

from __future__ import annotations

import pickle

import numpy as np

from privdl.data.datasets import DATASETS, Dataset
from privdl.data.files import find_file, read_bytes
from privdl.errors import DataError


def _read(name: str, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    path = find_file([name], ["cifar-100-python", "cifar100"], f"CIFAR-100 {name}", data_dir)
    try:
        blob = pickle.loads(read_bytes(path), encoding="latin1")  # the official archive's own format
        X = np.asarray(blob["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        y = np.asarray(blob["fine_labels"], dtype=np.int64)
    except (pickle.UnpicklingError, KeyError, ValueError, EOFError) as exc:
        raise DataError(f"{path} is not a CIFAR-100 python pickle: {exc}") from None
    return X, y


@DATASETS.register("cifar100")
def cifar100(*, data_dir: str | None = None) -> Dataset:
    """CIFAR-100 (fine labels), pixels scaled to [0, 1] and standardised per channel with the training means."""
    X_train, y_train = _read("train", data_dir)
    X_test, y_test = _read("test", data_dir)
    scale = lambda a: a.astype(np.float32) / 255.0  # noqa: E731
    X_train, X_test = scale(X_train), scale(X_test)
    mean = X_train.mean(axis=(0, 2, 3), keepdims=True)
    std = X_train.std(axis=(0, 2, 3), keepdims=True)
    return Dataset("cifar100", (X_train - mean) / std, y_train, (X_test - mean) / std, y_test, 100,
                   source="CIFAR-100 python pickles")
