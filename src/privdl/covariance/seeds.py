"""Shared seeds and what a coalition of curious agents knows (seed 001 §V-D, SPEC §3).

A noise structure is an independent part σ_mix² I (each agent's own private seed) plus components
(H_k, R_cor^(k)): seed k is known to the agents H_k, and the noise it drives has covariance R_cor^(k) supported on
H_k × H_k. A coalition I knows every seed k with H_k ∩ I ≠ ∅ and can subtract that noise; what remains has
covariance R^(I) = σ_mix² I + Σ_{k: H_k ∩ I = ∅} R_cor^(k), and agent i ∉ I is protected when [(R^(I))⁻¹]_ii ≤ b.
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np

from privdl.covariance.problem import SeedComponent, precision_diagonal
from privdl.errors import ValidationError
from privdl.network.edges import adjacency, undirected_edges


# ---- seed-group constructions ------------------------------------------------------------------------------
def seed_groups(kind: str, w: np.ndarray, *, seed: int = 0) -> list[tuple[int, ...]]:
    """The agent sets H_k for a construction: ``global`` (one seed, H = V), ``edges`` (one seed per edge),
    ``neighbourhoods`` (one seed per closed neighbourhood {i} ∪ N(i)), ``groups:M`` (M disjoint groups of
    consecutive agents, sizes as equal as possible)."""
    n = w.shape[0]
    adj = adjacency(w) > 0
    if kind == "global":
        groups = [tuple(range(n))]
    elif kind == "edges":
        groups = undirected_edges(w)
    elif kind in ("neighbourhoods", "neighborhoods"):
        groups = [tuple(sorted({i, *np.flatnonzero(adj[i]).tolist()})) for i in range(n)]
    elif kind.startswith("groups:"):
        try:
            m = int(kind.split(":", 1)[1])
        except ValueError:
            raise ValidationError(f"seed groups {kind!r}: expected groups:M with an integer M") from None
        if not 1 <= m <= n:
            raise ValidationError(f"seed groups {kind!r}: M must be between 1 and n = {n}")
        groups = [tuple(int(i) for i in part) for part in np.array_split(np.arange(n), m)]
    else:
        raise ValidationError(f"unknown seed construction {kind!r}; choose global, edges, neighbourhoods or groups:M")
    del seed  # constructions are deterministic; the argument is reserved for randomised ones
    return check_groups(groups, n)


def check_groups(groups: list[tuple[int, ...]], n: int) -> list[tuple[int, ...]]:
    covered = set(itertools.chain.from_iterable(groups))
    bad = [i for i in covered if not 0 <= i < n]
    if bad:
        raise ValidationError(f"seed groups name agents outside 0..{n - 1}: {sorted(bad)[:5]}")
    missing = sorted(set(range(n)) - covered)
    if missing:
        raise ValidationError(f"seed groups leave agents in no group: {missing[:10]}"
                              f"{' ...' if len(missing) > 10 else ''} (every agent must hold at least one seed)")
    return groups


# ---- coalitions ----------------------------------------------------------------------------------------------
def check_coalition_size(q: int, n: int) -> int:
    if not isinstance(q, (int, np.integer)) or q < 0:
        raise ValidationError(f"coalition size q must be an integer >= 0, got {q!r}")
    if q >= n:
        raise ValidationError(f"coalition size q = {q} must be < n = {n} (some agent must remain to protect)")
    return int(q)


def coalition_views(groups: list[tuple[int, ...]], n: int, q: int) -> dict[frozenset[int], set[int]]:
    """For every coalition I with |I| ≤ q: the seeds it does not know, U(I), mapped to the agents i ∉ I that must
    be protected against it. Coalitions with the same U(I) face the same covariance, so they are merged."""
    q = check_coalition_size(q, n)
    member_sets = [set(h) for h in groups]
    views: dict[frozenset[int], set[int]] = {}
    for size in range(q + 1):
        for coalition in itertools.combinations(range(n), size):
            c = set(coalition)
            unknown = frozenset(k for k, h in enumerate(member_sets) if not (h & c))
            views.setdefault(unknown, set()).update(set(range(n)) - c)
    return views


def coalition_precisions(sigma_mix2: float, components: list[SeedComponent], n: int, *,
                         coalition_size: int) -> np.ndarray:
    """Per agent i: max over coalitions I with |I| ≤ q, i ∉ I, of [(R^(I))⁻¹]_ii — the precision of the noise
    agent i's gradient keeps against the worst coalition (q = 0: the external eavesdropper, [R⁻¹]_ii)."""
    q = coalition_size
    check_coalition_size(q, n)
    views = coalition_views([c.members for c in components], n, q) if components else {frozenset(): set(range(n))}
    embedded = [c.embedded(n) for c in components]
    worst = np.full(n, -np.inf)
    for unknown, agents in views.items():
        r = sigma_mix2 * np.eye(n) + sum((embedded[k] for k in unknown), np.zeros((n, n)))
        diag = precision_diagonal(r)
        idx = np.asarray(sorted(agents))
        worst[idx] = np.maximum(worst[idx], diag[idx])
    return worst


def coalition_worst_ratio(sigma_mix2: float, components: list[SeedComponent], n: int, *, coalition_size: int,
                          bound: float) -> tuple[float, dict[str, object]]:
    """max over coalitions |I| ≤ q and agents i ∉ I of [(R^(I))⁻¹]_ii / b, and where it is attained."""
    q, b = coalition_size, bound
    check_coalition_size(q, n)
    views = coalition_views([c.members for c in components], n, q) if components else {frozenset(): set(range(n))}
    embedded = [c.embedded(n) for c in components]
    worst, where = -np.inf, {}
    for unknown, agents in views.items():
        r = sigma_mix2 * np.eye(n) + sum((embedded[k] for k in unknown), np.zeros((n, n)))
        diag = precision_diagonal(r)
        idx = np.asarray(sorted(agents))
        k = int(np.argmax(diag[idx]))
        ratio = float(diag[idx][k] / b)
        if ratio > worst:
            worst, where = ratio, {"agent": int(idx[k]), "known_seeds": len(components) - len(unknown)}
    return worst, where
