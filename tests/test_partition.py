import numpy as np
import pytest

from privdl.data import a_t_fractions, class_counts, partition
from privdl.errors import ValidationError

LABELS = np.repeat(np.arange(10), 300)


def _check_is_a_partition(parts, n_samples):
    allidx = np.concatenate(parts)
    assert len(allidx) == n_samples and len(np.unique(allidx)) == n_samples


def test_iid_split_is_even_and_complete():
    parts = partition("iid", LABELS, 7, np.random.default_rng(0))
    _check_is_a_partition(parts, len(LABELS))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_a_t_fractions_columns_sum_to_one_and_extremes():
    for t in (0.0, 0.25, 1.0):
        a = a_t_fractions(10, 10, t)
        assert np.allclose(a.sum(axis=0), 1)
    assert np.allclose(a_t_fractions(10, 10, 0.0), 0.1)  # IID
    assert np.allclose(a_t_fractions(10, 10, 1.0), np.eye(10))  # disjoint classes


@pytest.mark.parametrize("t", [0.0, 0.5, 1.0])
def test_a_t_split_proportions_match_a_ij(t):
    parts = partition("a_t", LABELS, 10, np.random.default_rng(1), t=t)
    _check_is_a_partition(parts, len(LABELS))
    counts = class_counts(LABELS, parts, 10) / 300
    assert np.abs(counts - a_t_fractions(10, 10, t)).max() <= 1 / 300 + 1e-12


def test_dirichlet_concentration_controls_heterogeneity():
    rng = np.random.default_rng(2)
    spread = {}
    for alpha in (0.1, 1000.0):
        parts = partition("dirichlet", LABELS, 5, rng, alpha=alpha)
        _check_is_a_partition(parts, len(LABELS))
        frac = class_counts(LABELS, parts, 10) / 300  # agents x classes
        spread[alpha] = np.abs(frac - 0.2).mean()
    assert spread[1000.0] < 0.03 < spread[0.1]


def test_missing_classes_agent_lacks_its_two_classes():
    parts = partition("missing_classes", LABELS, 5, np.random.default_rng(3))
    _check_is_a_partition(parts, len(LABELS))
    counts = class_counts(LABELS, parts, 10)
    for k in range(5):
        assert counts[k, 2 * k] == 0 and counts[k, 2 * k + 1] == 0
        assert (counts[k] > 0).sum() == 8


def test_bad_partition_inputs():
    with pytest.raises(ValidationError, match="alpha"):
        partition("dirichlet", LABELS, 3, np.random.default_rng(0), alpha=0)
    with pytest.raises(ValidationError, match="valid names"):
        partition("by_magic", LABELS, 3, np.random.default_rng(0))


def test_dirichlet_min_size_redraws_until_every_agent_holds_enough():
    from privdl.data.partition import dirichlet

    labels = np.repeat(np.arange(10), 800)
    small = min(len(p) for p in dirichlet(labels, 10, np.random.default_rng(7), alpha=0.1))
    parts = dirichlet(labels, 10, np.random.default_rng(7), alpha=0.1, min_size=64)
    assert small < 64 <= min(len(p) for p in parts)  # the default draw had a tiny agent; the redraw has none
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    with pytest.raises(ValidationError, match="min_size"):
        dirichlet(labels, 10, np.random.default_rng(7), alpha=0.1, min_size=0)
