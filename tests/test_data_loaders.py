import gzip
import shutil

import numpy as np
import pytest

from privdl.data import load_dataset
from privdl.data.idx import parse_idx
from privdl.errors import DataError


def test_a9a_loads_with_123_features_and_01_labels(shared_data):
    ds = load_dataset("a9a", data_dir=str(shared_data))
    assert ds.X_train.shape == (32561, 123) and ds.X_test.shape == (16281, 123)
    assert np.bincount(ds.y_train).tolist() == [24720, 7841] and np.bincount(ds.y_test).tolist() == [12435, 3846]


def test_corrupted_a9a_is_rejected_by_checksum(shared_data, tmp_path):
    (tmp_path / "a9a").mkdir()
    raw = gzip.decompress((shared_data / "a9a" / "a9a.gz").read_bytes())
    (tmp_path / "a9a" / "a9a").write_bytes(raw.replace(b"+1", b"-1", 1))
    shutil.copy(shared_data / "a9a" / "a9a.t.gz", tmp_path / "a9a" / "a9a.t.gz")
    with pytest.raises(DataError, match="checksum mismatch"):
        load_dataset("a9a", data_dir=str(tmp_path))


def test_missing_data_file_error_says_which_and_where(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PRIVDL_DATA_DIR", raising=False)
    with pytest.raises(DataError, match=r"a9a.*not found.*Put it in"):
        load_dataset("a9a", data_dir=str(tmp_path / "nowhere"))


def test_missing_mnist_train_images_is_named(shared_data):
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        load_dataset("mnist", data_dir=str(shared_data))


def test_idx_parser_reads_mnist_test_labels_and_checks_header(shared_data):
    labels = parse_idx(gzip.decompress((shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    assert np.bincount(labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    with pytest.raises(DataError, match="magic"):
        parse_idx(b"\x00\x00\x08\x04" + b"\x00" * 8)
    with pytest.raises(DataError, match="header says"):
        parse_idx((2049).to_bytes(4, "big") + (5).to_bytes(4, "big") + b"\x01\x02")


def test_bundled_sklearn_sets_need_no_files():
    ds = load_dataset("breast_cancer")
    assert ds.X_train.shape[1] == 30 and ds.n_classes == 2
    assert abs(ds.X_train.mean()) < 1e-5  # standardized on the training split
    assert load_dataset("digits").n_classes == 10


@pytest.mark.exact
@pytest.mark.parametrize("name", ["breast_cancer", "digits", "iris", "wine"])
def test_bundled_sets_read_without_sklearn_equal_its_loaders_to_the_bit(name, monkeypatch):
    """The files read directly (privdl.data.bundled.read_sklearn) give scikit-learn's own loader's arrays to the bit
    (values, dtypes, shapes), and the Dataset built from them equals the one built through the loader (the
    fallback where the file is not found)."""
    import sklearn.datasets

    from privdl.data import bundled

    assert bundled.sklearn_file(bundled.SKLEARN_FILES[name][0]) is not None  # this install: the direct read
    X, y = bundled.read_sklearn(name)
    X_ref, y_ref = getattr(sklearn.datasets, f"load_{name}")(return_X_y=True)
    assert X.dtype == X_ref.dtype and y.dtype == y_ref.dtype and X.shape == X_ref.shape and y.shape == y_ref.shape
    assert X.tobytes() == X_ref.tobytes() and y.tobytes() == y_ref.tobytes()
    direct = load_dataset(name)
    monkeypatch.setattr(bundled, "sklearn_file", lambda file: None)
    through = load_dataset(name)
    for field in ("X_train", "y_train", "X_test", "y_test"):
        a, b = getattr(direct, field), getattr(through, field)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), field
    assert direct.n_classes == through.n_classes


@pytest.mark.slow  # a fresh interpreter
def test_loading_a_bundled_set_imports_no_sklearn():
    """What a worker of a run on iris or digits loads for its data: numpy, not sklearn (nor the scipy.stats and
    scipy.optimize it imports)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\nfrom privdl.data import load_dataset\nfor n in ('iris', 'digits', 'wine', 'breast_cancer'):\n"
            "    load_dataset(n)\nprint(sorted(m for m in ('sklearn', 'scipy.stats', 'scipy.optimize') "
            "if m in sys.modules))")
    src = Path(__file__).resolve().parents[1] / "src"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(src)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_mnist1d_is_generated_locally():
    pytest.importorskip("mnist1d")
    ds = load_dataset("mnist1d")
    assert ds.X_train.shape == (4000, 40) and ds.X_test.shape == (1000, 40) and ds.n_classes == 10


def test_fashion_mnist_from_the_debian_package_passes_checksums():
    from privdl.data.idx import FASHION_SYSTEM_DIR

    if not (FASHION_SYSTEM_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("Debian package dataset-fashion-mnist not installed (apt-get install dataset-fashion-mnist)")
    ds = load_dataset("fashion_mnist")
    assert ds.X_train.shape == (60000, 1, 28, 28) and ds.X_test.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10 and 0.0 <= ds.X_train.min() < ds.X_train.max() <= 1.0


def test_task_input_normalisation_resize_and_t10k_split_options(shared_data):
    """normalize = [mean, std] is torchvision's Normalize; resize interpolates images; train_size splits MNIST's
    test images (and is refused for a dataset with its own split)."""
    import torch

    from privdl.errors import ValidationError
    from privdl.tasks import make_task

    plain = make_task("softmax", 4, dataset="mnist_t10k", data_dir=str(shared_data), train_size=8000)
    norm = make_task("softmax", 4, dataset="mnist_t10k", data_dir=str(shared_data), train_size=8000,
                     normalize=[0.1307, 0.3081])
    assert plain.X_test.shape[0] == 2000 and sum(len(p) for p in plain.parts) == 8000
    torch.testing.assert_close(norm.X_test, (plain.X_test - 0.1307) / 0.3081, rtol=1e-5, atol=1e-5)
    big = make_task("cnn", 4, dataset="mnist_t10k", data_dir=str(shared_data), resize=32)
    assert big.X.shape[-2:] == (32, 32) and big.X_test.shape[-2:] == (32, 32)
    # bilinear: a constant image stays constant, and the mean intensity is kept to within a few percent
    assert abs(float(big.X_test.mean()) - float(plain.X_test.mean())) < 0.02
    with pytest.raises(ValidationError, match="train_size splits MNIST's test images"):
        make_task("softmax", 4, dataset="digits", train_size=100)
