"""Partitioning a dataset across n agents (SPEC §1): IID, Dirichlet(α), A(t) (seed 004), missing classes (seed 002).

Each partitioner returns a list of n index arrays into the training set; every sample goes to exactly one agent.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from privdl.errors import ValidationError
from privdl.registry import Registry

PARTITIONERS: Registry[Callable[..., list[np.ndarray]]] = Registry("partition")


def _split_by_fractions(idx: np.ndarray, fractions: np.ndarray) -> list[np.ndarray]:
    """Split ``idx`` into len(fractions) consecutive pieces with sizes rounded from the fractions (sum kept)."""
    counts = np.floor(fractions * len(idx)).astype(int)
    remainder = len(idx) - counts.sum()
    if remainder:  # largest fractional parts get the leftovers
        order = np.argsort(-(fractions * len(idx) - counts), kind="stable")
        counts[order[:remainder]] += 1
    return np.split(idx, np.cumsum(counts)[:-1])


def _check(n: int, labels: np.ndarray) -> None:
    if n < 1:
        raise ValidationError(f"number of agents must be >= 1, got {n}")
    if len(labels) < n:
        raise ValidationError(f"cannot split {len(labels)} samples among {n} agents")


@PARTITIONERS.register("iid")
def iid(labels: np.ndarray, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and split evenly (sizes differ by at most one)."""
    _check(n, labels)
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), n)]


@PARTITIONERS.register("dirichlet")
def dirichlet(labels: np.ndarray, n: int, rng: np.random.Generator, *, alpha: float = 10.0, min_size: int = 1,
              max_tries: int = 100) -> list[np.ndarray]:
    """For each class, split its samples among agents with proportions ~ Dir(α·1_n). Redrawn while an agent holds
    fewer than ``min_size`` samples (default 1: no agent is empty; e.g. the lot size of DP-SGD at small α)."""
    _check(n, labels)
    if alpha <= 0:
        raise ValidationError(f"Dirichlet concentration alpha must be > 0, got {alpha}")
    if not (isinstance(min_size, int) and 1 <= min_size <= len(labels) // n):
        raise ValidationError(f"Dirichlet min_size must be an integer in [1, {len(labels) // n}] (samples / agents), "
                              f"got {min_size!r}")
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(n)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            for i, piece in enumerate(_split_by_fractions(idx, rng.dirichlet(np.full(n, alpha)))):
                parts[i].append(piece)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if all(len(p) >= min_size for p in out):
            return out
    raise ValidationError(f"Dirichlet(alpha={alpha}) left an agent with fewer than {min_size} samples in {max_tries} "
                          "draws; raise alpha or lower min_size")


def a_t_fractions(n: int, n_classes: int, t: float) -> np.ndarray:
    """The matrix a_ij(t) of seed 004: agent i's share of class j. a_ij = (1 − t)/n unless i ≡ j (mod n), in which
    case the agent takes the rest, 1 − (n − 1)(1 − t)/n. Columns sum to 1; t = 0 is IID, t = 1 disjoint classes."""
    if not 0.0 <= t <= 1.0:
        raise ValidationError(f"A(t) split needs 0 <= t <= 1, got {t}")
    a = np.full((n, n_classes), (1.0 - t) / n)
    for j in range(n_classes):
        a[j % n, j] = 1.0 - (n - 1) * (1.0 - t) / n
    return a


@PARTITIONERS.register("a_t")
def a_t(labels: np.ndarray, n: int, rng: np.random.Generator, *, t: float = 0.5) -> list[np.ndarray]:
    """Seed 004's A(t) split: agent i holds fraction a_ij(t) of class j."""
    _check(n, labels)
    classes = np.unique(labels)
    a = a_t_fractions(n, int(classes.max()) + 1, t)
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for c in classes:
        idx = rng.permutation(np.flatnonzero(labels == c))
        for i, piece in enumerate(_split_by_fractions(idx, a[:, c])):
            parts[i].append(piece)
    return [np.sort(np.concatenate(p)) for p in parts]


@PARTITIONERS.register("missing_classes")
def missing_classes(labels: np.ndarray, n: int, rng: np.random.Generator, *,
                    missing: list[list[int]] | None = None) -> list[np.ndarray]:
    """Seed 002's split: agent k lacks the classes in ``missing[k]`` (default: classes 2k and 2k+1 mod K); each
    class is spread evenly over the agents that do not lack it."""
    _check(n, labels)
    classes = np.unique(labels)
    k_classes = int(classes.max()) + 1
    if missing is None:
        missing = [[(2 * k) % k_classes, (2 * k + 1) % k_classes] for k in range(n)]
    if len(missing) != n:
        raise ValidationError(f"missing_classes needs one list per agent ({n}), got {len(missing)}")
    parts: list[list[np.ndarray]] = [[] for _ in range(n)]
    for c in classes:
        holders = [k for k in range(n) if c not in missing[k]]
        if not holders:
            raise ValidationError(f"class {c} is missing at every agent")
        idx = rng.permutation(np.flatnonzero(labels == c))
        for k, piece in zip(holders, np.array_split(idx, len(holders))):
            parts[k].append(piece)
    out = [np.sort(np.concatenate(p)) if p else np.array([], dtype=int) for p in parts]
    if any(len(p) == 0 for p in out):
        raise ValidationError("missing_classes left an agent without data")
    return out


@PARTITIONERS.register("explicit")
def explicit(labels: np.ndarray, n: int, rng: np.random.Generator, *,
             parts: list[list[int]] | list[np.ndarray] | None = None) -> list[np.ndarray]:
    """Agent i holds exactly the training indices ``parts[i]`` (they may repeat across agents: independent copies of
    one system, as audits train them)."""
    if parts is None or len(parts) != n:
        raise ValidationError(f"explicit partition needs one index list per agent ({n})")
    out = [np.asarray(p, dtype=np.int64) for p in parts]
    for i, p in enumerate(out):
        if len(p) == 0:
            raise ValidationError(f"explicit partition leaves agent {i} without data")
        if p.min() < 0 or p.max() >= len(labels):
            raise ValidationError(f"explicit partition: agent {i} has an index outside 0..{len(labels) - 1}")
    return out


def partition(name: str, labels: np.ndarray, n: int, rng: np.random.Generator, **params: object) -> list[np.ndarray]:
    """Run the registered partitioner ``name``."""
    return PARTITIONERS.build(name, np.asarray(labels), n, rng, **params)


def class_counts(labels: np.ndarray, parts: list[np.ndarray], n_classes: int) -> np.ndarray:
    """(n_agents, n_classes) matrix of how many samples of each class each agent holds."""
    return np.stack([np.bincount(labels[p], minlength=n_classes) for p in parts])
