"""Datasets: train/test arrays plus metadata, and the registry of loaders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from privdl.registry import Registry


@dataclass
class Dataset:
    """A supervised dataset. ``X`` arrays are float32 (N, *feature_shape); ``y`` int64 class labels."""

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    source: str = ""

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.X_train.shape[1:])


DATASETS: Registry[Callable[..., Dataset]] = Registry("dataset")


def load_dataset(name: str, **kwargs: object) -> Dataset:
    """Load the registered dataset ``name`` (see ``DATASETS.names()``)."""
    return DATASETS.get(name)(**kwargs)


def train_test_split(X: np.ndarray, y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    k = int(round(len(y) * (1 - test_fraction)))
    return X[perm[:k]], y[perm[:k]], X[perm[k:]], y[perm[k:]]
