"""Datasets that need no files: scikit-learn's bundled sets and mnist1d generated locally."""

from __future__ import annotations

import numpy as np

from privdl.data.datasets import DATASETS, Dataset, train_test_split
from privdl.errors import DataError


def _sklearn(name: str, loader, test_fraction: float, seed: int, standardize: bool, scale: float = 1.0) -> Dataset:
    X, y = loader(return_X_y=True)
    X = np.asarray(X, dtype=np.float64) / scale
    X_tr, y_tr, X_te, y_te = train_test_split(X, np.asarray(y, dtype=np.int64), test_fraction, seed)
    if standardize:  # statistics of the training split only
        mu, sd = X_tr.mean(axis=0), X_tr.std(axis=0)
        sd[sd == 0] = 1.0
        X_tr, X_te = (X_tr - mu) / sd, (X_te - mu) / sd
    n_classes = int(max(y_tr.max(), y_te.max()) + 1)
    return Dataset(name, X_tr.astype(np.float32), y_tr, X_te.astype(np.float32), y_te, n_classes,
                   source=f"scikit-learn load_{name}")


@DATASETS.register("breast_cancer")
def breast_cancer(*, test_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    """scikit-learn's Wisconsin breast cancer (569 × 30, 2 classes), standardized on the training split."""
    from sklearn.datasets import load_breast_cancer

    return _sklearn("breast_cancer", load_breast_cancer, test_fraction, split_seed, True)


@DATASETS.register("digits")
def digits(*, test_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    """scikit-learn's 8×8 digits (1797 × 64, 10 classes), pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    return _sklearn("digits", load_digits, test_fraction, split_seed, False, scale=16.0)


@DATASETS.register("iris")
def iris(*, test_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    from sklearn.datasets import load_iris

    return _sklearn("iris", load_iris, test_fraction, split_seed, True)


@DATASETS.register("wine")
def wine(*, test_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    from sklearn.datasets import load_wine

    return _sklearn("wine", load_wine, test_fraction, split_seed, True)


@DATASETS.register("mnist1d")
def mnist1d(*, seed: int = 42) -> Dataset:
    """mnist1d (4000 train / 1000 test, length 40, 10 classes) generated locally (no download)."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise DataError("dataset 'mnist1d' needs the mnist1d package: pip install 'privdl[mnist1d]'") from None
    args = get_dataset_args()
    args.seed = seed
    d = make_dataset(args)
    return Dataset("mnist1d", np.asarray(d["x"], np.float32), np.asarray(d["y"], np.int64),
                   np.asarray(d["x_test"], np.float32), np.asarray(d["y_test"], np.int64), 10,
                   source="mnist1d.make_dataset (generated locally)")
