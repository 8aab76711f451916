"""Datasets that need no files: scikit-learn's bundled sets and mnist1d generated locally.

scikit-learn's sets are read from the files scikit-learn installs (``sklearn/datasets/data``), as its loaders read
them, without importing scikit-learn: ``import sklearn.datasets`` loads scipy.stats, scipy.optimize and
sklearn.base — 1.5–3.5 s of CPU in every process of a run, most of a runtime worker's start beside torch's own
import, to parse a CSV file (issue 44, "a worker imports only what it runs"). The arrays are scikit-learn's to the
bit (tests/test_data_loaders.py compares them with its loaders); an install that keeps the files elsewhere is read
through scikit-learn's loaders, as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from privdl.data.datasets import DATASETS, Dataset, train_test_split
from privdl.errors import DataError

#: the bundled sets: name → (scikit-learn's file in sklearn/datasets/data, its loader's name)
SKLEARN_FILES = {"breast_cancer": ("breast_cancer.csv", "load_breast_cancer"), "digits": ("digits.csv.gz",
                 "load_digits"), "iris": ("iris.csv", "load_iris"), "wine": ("wine_data.csv", "load_wine")}


def sklearn_file(name: str) -> Path | None:
    """scikit-learn's installed copy of the file ``name`` of its bundled sets, found without importing
    scikit-learn (``find_spec`` of a top-level package locates it, it does not run it); None where there is none."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "datasets" / "data" / name
        if path.is_file():
            return path
    return None


def read_sklearn(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) of scikit-learn's bundled set ``name`` (a key of :data:`SKLEARN_FILES`), as its ``load_<name>(
    return_X_y=True)`` returns them: the same parsing calls on the same file (``load_csv_data``: a header line
    ``n_samples, n_features, class names…``, then one row per sample, the label last; digits: ``np.loadtxt`` of the
    gzipped CSV, the label in the last column) — read directly when the file is found (:func:`sklearn_file`), else
    through scikit-learn's loader."""
    file, loader = SKLEARN_FILES[name]
    path = sklearn_file(file)
    if path is None:
        import sklearn.datasets

        return getattr(sklearn.datasets, loader)(return_X_y=True)
    if file.endswith(".gz"):
        import gzip

        with path.open("rb") as raw, gzip.open(raw, mode="rt", encoding="utf-8") as text:
            data = np.loadtxt(text, delimiter=",")
        return data[:, :-1], data[:, -1].astype(int, copy=False)
    import csv

    with path.open("r", encoding="utf-8") as fh:
        rows = csv.reader(fh)
        header = next(rows)
        n_samples, n_features = int(header[0]), int(header[1])
        data = np.empty((n_samples, n_features))
        target = np.empty((n_samples,), dtype=int)
        for i, row in enumerate(rows):
            data[i] = np.asarray(row[:-1], dtype=np.float64)
            target[i] = np.asarray(row[-1], dtype=int)
    return data, target


def _sklearn(name: str, test_fraction: float, seed: int, standardize: bool, scale: float = 1.0) -> Dataset:
    X, y = read_sklearn(name)
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
    return _sklearn("breast_cancer", test_fraction, split_seed, True)


@DATASETS.register("digits")
def digits(*, test_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    """scikit-learn's 8×8 digits (1797 × 64, 10 classes), pixels scaled to [0, 1]."""
    return _sklearn("digits", test_fraction, split_seed, False, scale=16.0)


@DATASETS.register("iris")
def iris(*, test_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    return _sklearn("iris", test_fraction, split_seed, True)


@DATASETS.register("wine")
def wine(*, test_fraction: float = 0.2, split_seed: int = 0) -> Dataset:
    return _sklearn("wine", test_fraction, split_seed, True)


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
