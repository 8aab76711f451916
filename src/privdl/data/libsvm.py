"""LIBSVM text datasets (a9a), read with scikit-learn's svmlight reader after a checksum of the content."""

from __future__ import annotations

import io

import numpy as np

from privdl.data.datasets import DATASETS, Dataset
from privdl.data.files import check_digest, find_file, read_bytes

# sha256 of the uncompressed files (LIBSVM binary/a9a; see shared/data/SOURCES.md)
A9A_SHA256 = {
    "a9a": "f5d5ffd8d865ff41328e7ee043e4b020816914ff6843ff15b98905ddbedce906",
    "a9a.t": "1f448a153f0320399a7e40836eb207655b0bde0f21fc941cc472193daa9f5de9",
}
A9A_FEATURES = 123


def _read(name: str, data_dir: str | None, verify: bool) -> tuple[np.ndarray, np.ndarray]:
    path = find_file([name], ["a9a", "."], f"a9a ({'train' if name == 'a9a' else 'test'} split)", data_dir)
    raw = read_bytes(path)
    if verify:
        check_digest(raw, path, sha256=A9A_SHA256[name])
    from sklearn.datasets import load_svmlight_file  # 1.6 s of imports: only where a9a is read

    X, y = load_svmlight_file(io.BytesIO(raw), n_features=A9A_FEATURES)
    return np.asarray(X.todense(), dtype=np.float32), ((y + 1) / 2).astype(np.int64)


@DATASETS.register("a9a")
def a9a(*, data_dir: str | None = None, verify: bool = True) -> Dataset:
    """LIBSVM a9a (binarized UCI Adult): 32561 train / 16281 test, 123 binary features, labels mapped {-1,1}→{0,1}.

    Loaded with ``n_features=123`` (feature 123 occurs once in train, never in test); no feature scaling (as DECOR).
    """
    X_train, y_train = _read("a9a", data_dir, verify)
    X_test, y_test = _read("a9a.t", data_dir, verify)
    return Dataset("a9a", X_train, y_train, X_test, y_test, 2, source="LIBSVM binary/a9a")
