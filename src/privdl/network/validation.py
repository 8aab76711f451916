"""Validation of user-supplied mixing matrices (SPEC §1). Each failure names the property and the worst value."""

from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sps

from privdl.errors import ValidationError
from privdl.network.edges import adjacency

TOL = 1e-9


def directed_pair(w: np.ndarray | sps.sparray, tol: float = 0.0) -> tuple[int, int] | None:
    """An off-diagonal pair (i, j) with |W_ij| > tol but |W_ji| <= tol (a directed edge j → i with no reverse), or
    None when W's support is symmetric. Dense or sparse W; a sparse one in O(nnz)."""
    if sps.issparse(w):
        c = sps.csr_array(w)
        keep = np.abs(c.data) > tol
        if not (c.has_canonical_format and keep.all()):  # never sort or compact the caller's W in place
            c = c.copy()
            c.data[~keep] = 0
            c.eliminate_zeros()
            c.sum_duplicates()
        del keep
        s = sps.csr_array((np.ones(c.nnz, dtype=np.int8), c.indices, c.indptr), shape=c.shape)  # W's pattern
        t = s.T.tocsr()  # canonical (sorted) CSR of the transpose: the same structure iff the support is symmetric
        t.sort_indices()
        if np.array_equal(t.indptr, s.indptr) and np.array_equal(t.indices, s.indices):
            return None
        d = (s - t).tocoo()
        k = int(np.argmax(d.data > 0))  # an entry of s that t lacks
        return int(d.row[k]), int(d.col[k])
    support = np.abs(np.asarray(w)) > tol
    bad = support & ~support.T
    if not bad.any():
        return None
    i, j = np.argwhere(bad)[0]
    return int(i), int(j)


def require_symmetric_support(w: np.ndarray | sps.sparray, tol: float = 0.0, what: str = "mixing matrix",
                              symbol: str = "W") -> None:
    """Refuse a W whose support is not symmetric (a directed graph: privdl's networks are undirected, and the
    algorithms' edge lists, the accountants' neighbour sets and the canceling noise of the correlated designs all
    assume every edge has its reverse), naming one offending pair. Every loader of W calls this."""
    pair = directed_pair(w, tol)
    if pair is None:
        return
    i, j = pair
    wij = w[i, j] if not sps.issparse(w) else sps.csr_array(w)[[i], :].toarray()[0, j]
    wji = w[j, i] if not sps.issparse(w) else sps.csr_array(w)[[j], :].toarray()[0, i]
    raise ValidationError(
        f"{what} must have a symmetric support (an undirected graph): {symbol}[{i},{j}] = {float(wij):.3g} but "
        f"{symbol}[{j},{i}] = {float(wji):.3g}, so agent {i} hears agent {j} and {j} does not hear {i}; give every "
        "edge its reverse, or read it as a directed network ([network] directed = true: push-sum weights, "
        "algorithm sgp)")


def support_graph(w: np.ndarray, tol: float = 0.0) -> nx.Graph:
    """The undirected graph whose edges are the off-diagonal entries with |W_ij| > tol (or |W_ji| > tol)."""
    g = nx.empty_graph(len(w))
    ii, jj = np.nonzero(np.triu(adjacency(np.where(np.abs(w) > tol, w, 0.0))))
    g.add_edges_from(zip(ii.tolist(), jj.tolist()))
    return g


def slem(w: np.ndarray) -> float:
    """Second largest eigenvalue modulus of a doubly stochastic W (= spectral radius of W − 11ᵀ/n)."""
    n = len(w)
    dev = w - np.full((n, n), 1.0 / n)
    if np.allclose(w, w.T, atol=1e-12):
        return float(np.max(np.abs(np.linalg.eigvalsh(0.5 * (dev + dev.T)))))
    return float(np.max(np.abs(np.linalg.eigvals(dev))))


def validate_mixing_matrix(w: np.ndarray, graph: nx.Graph | None = None, *, tol: float = TOL) -> np.ndarray:
    """Check that ``w`` is a valid mixing matrix (for ``graph`` if given) and return it as float64.

    Properties: square, finite, non-negative, a symmetric support (entries above ``tol``), rows and columns sum to 1
    (within ``tol``), zero off the graph, graph connected, second largest eigenvalue modulus < 1.
    """
    w = np.asarray(w, dtype=float)
    if w.ndim != 2 or w.shape[0] != w.shape[1]:
        raise ValidationError(f"mixing matrix must be square, got shape {w.shape}")
    n = w.shape[0]
    if n < 1:
        raise ValidationError("mixing matrix is empty")
    if not np.all(np.isfinite(w)):
        bad = np.argwhere(~np.isfinite(w))[0]
        raise ValidationError(f"mixing matrix has a non-finite entry W[{bad[0]},{bad[1]}] = {w[tuple(bad)]}")
    if w.min() < -tol:
        i, j = np.unravel_index(np.argmin(w), w.shape)
        raise ValidationError(f"mixing matrix must be non-negative: W[{i},{j}] = {w[i, j]:.3g}")
    require_symmetric_support(w, tol)
    rows = np.abs(w.sum(axis=1) - 1.0)
    if rows.max() > tol:
        i = int(np.argmax(rows))
        raise ValidationError(
            f"mixing matrix is not doubly stochastic: row {i} sums to {w[i].sum():.12g} (tolerance {tol:g})"
        )
    cols = np.abs(w.sum(axis=0) - 1.0)
    if cols.max() > tol:
        j = int(np.argmax(cols))
        raise ValidationError(
            f"mixing matrix is not doubly stochastic: column {j} sums to {w[:, j].sum():.12g} (tolerance {tol:g})"
        )
    if graph is not None:
        if graph.number_of_nodes() != n:
            raise ValidationError(f"mixing matrix is {n}×{n} but the graph has {graph.number_of_nodes()} nodes")
        adj = adjacency(graph) > 0
        np.fill_diagonal(adj, True)
        off = np.where(~adj, np.abs(w), 0.0)
        if off.max() > tol:
            i, j = np.unravel_index(np.argmax(off), off.shape)
            raise ValidationError(f"mixing matrix has weight W[{i},{j}] = {w[i, j]:.3g} on a pair that is not an edge")
    else:
        graph = support_graph(w, tol)
    if n > 1 and not nx.is_connected(graph):
        comps = list(nx.connected_components(graph))
        raise ValidationError(
            f"graph is disconnected: {len(comps)} components (e.g. agents {sorted(comps[0])[:10]})"
        )
    if n > 1:
        s = slem(w)
        if s >= 1.0 - 1e-12:
            raise ValidationError(
                f"second largest eigenvalue modulus of W is {s:.12g}; it must be < 1 for consensus"
            )
    return w
