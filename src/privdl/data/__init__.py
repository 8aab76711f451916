"""Data: loaders (LIBSVM, IDX, scikit-learn, mnist1d) with checksums, and partitioners across agents."""

from privdl.data import bundled, cifar, idx, libsvm  # noqa: F401  (register loaders)
from privdl.data.datasets import DATASETS, Dataset, load_dataset
from privdl.data.partition import PARTITIONERS, a_t_fractions, class_counts, partition

__all__ = ["DATASETS", "PARTITIONERS", "Dataset", "a_t_fractions", "class_counts", "load_dataset", "partition"]
