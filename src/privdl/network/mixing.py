"""Mixing rules (SPEC §1): symmetric, doubly stochastic W on undirected graphs."""

from __future__ import annotations

from typing import Callable

import networkx as nx
import numpy as np

from privdl.errors import ValidationError
from privdl.network.edges import adjacency as _adjacency
from privdl.network.edges import laplacian as _laplacian
from privdl.registry import Registry

MIXING_RULES: Registry[Callable[[nx.Graph], np.ndarray]] = Registry("mixing rule")


def _fill_diagonal(w: np.ndarray) -> np.ndarray:
    np.fill_diagonal(w, 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


@MIXING_RULES.register("metropolis_hastings")
def metropolis_hastings(graph: nx.Graph) -> np.ndarray:
    """W_ij = 1 / (1 + max(d_i, d_j)) on edges, W_ii = 1 − Σ_j W_ij (the seeds' default)."""
    a = _adjacency(graph)
    deg = a.sum(axis=1)
    w = a / (1.0 + np.maximum(deg[:, None], deg[None, :]))
    return _fill_diagonal(w)


@MIXING_RULES.register("max_degree")
def max_degree(graph: nx.Graph) -> np.ndarray:
    """W_ij = 1 / (1 + d_max) on edges."""
    a = _adjacency(graph)
    w = a / (1.0 + a.sum(axis=1).max())
    return _fill_diagonal(w)


@MIXING_RULES.register("laplacian")
def laplacian(graph: nx.Graph) -> np.ndarray:
    """W = I − L / (d_max + 1), L the unweighted Laplacian (seed 002's Laplacian rule)."""
    lap = _laplacian(graph)
    return np.eye(len(lap)) - lap / (np.diag(lap).max() + 1.0)


@MIXING_RULES.register("uniform")
def uniform(graph: nx.Graph) -> np.ndarray:
    """W = 11ᵀ / n; only on the complete graph."""
    n = graph.number_of_nodes()
    if graph.number_of_edges() != n * (n - 1) // 2:
        raise ValidationError(
            f"mixing rule 'uniform' needs the complete graph; this graph has {graph.number_of_edges()} of "
            f"{n * (n - 1) // 2} edges"
        )
    return np.full((n, n), 1.0 / n)


@MIXING_RULES.register("push_sum")
def push_sum(graph: nx.Graph) -> np.ndarray:
    """Column-stochastic push-sum weights are for directed networks only (:mod:`privdl.network.directed`)."""
    raise ValidationError("mixing rule 'push_sum' is column stochastic, for directed networks: set [network] "
                          "directed = true (an undirected graph then sends both ways along each edge), or use a "
                          "doubly stochastic rule (metropolis_hastings, max_degree, laplacian, uniform) on an "
                          "undirected network")


def lazy(w: np.ndarray) -> np.ndarray:
    """(I + W) / 2: positive definite when W is symmetric doubly stochastic (needed by exact diffusion)."""
    return 0.5 * (np.eye(len(w)) + w)


def mixing_matrix(graph: nx.Graph, rule: str, *, lazy_: bool = False) -> np.ndarray:
    """The mixing matrix of ``graph`` under the registered ``rule`` (optionally its lazy version)."""
    w = MIXING_RULES.get(rule)(graph)
    return lazy(w) if lazy_ else w
