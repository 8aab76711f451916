"""Large networks: W as a CSR matrix built from edge arrays, never an n×n array (SPEC §1, issue 16).

Above :data:`DENSE_MAX_N` agents a :class:`~privdl.network.Network` keeps W sparse (``scipy.sparse.csr_array``) and
its graph as edge arrays; networkx is not used to build it (a networkx graph of 10⁶ agents costs gigabytes). The
topologies that have an array generator here (``ring``, ``path``, ``star``, ``erdos_renyi``) build a 10⁶-agent graph
in seconds; the others are drawn by networkx and converted. Every object that would be dense (covariance designs, W
for a dense Comm, the Laplacian, spectra) goes through :func:`require_dense`, which estimates its memory up front and
refuses with the number when it would not fit.

**Erdős–Rényi above DENSE_MAX_N** is drawn by :func:`erdos_renyi_edges` (the same law G(n, p) — a binomial number of
edges, then that many distinct pairs uniformly — but a different random stream from networkx's, so the graph of a
given seed differs from the one networkx would draw). ``connect = "bridge"`` (both paths) joins every component but
the largest to a uniformly chosen agent of the largest by one edge: the result is connected and no longer exactly
G(n, p); sparse ER (p = c/n, c ≈ 10) is almost never connected at large n (≈ n·e^(−c) isolated agents), so resampling
(the default, ``connect = "resample"``) is refused up front there with that number.

**W is primitive iff** the graph is connected and (some w_ii > 0 or the graph is not bipartite): for a symmetric,
doubly stochastic, non-negative W this is exactly "second largest eigenvalue modulus < 1", checked without an
eigen-decomposition.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Callable

import numpy as np
import scipy.sparse as sps
from scipy.sparse import csgraph

from privdl.errors import ValidationError
from privdl.network.edges import graph_arrays, index_dtype
from privdl.network.mixing import MIXING_RULES
from privdl.network.validation import require_symmetric_support

log = logging.getLogger("privdl.network")

#: Networks with more agents than this keep W sparse (a dense W of 4096 agents is 128 MiB).
DENSE_MAX_N = 4096
TOL = 1e-9


# ---- memory -----------------------------------------------------------------------------------------------------------
def available_bytes() -> int:
    """Memory the OS says is available now (MemAvailable), or the physical memory where that is unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 34


def human_bytes(b: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if b < 1024 or unit == "TB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} TB"


def require_dense(n: int, what: str, *, copies: int = 1, itemsize: int = 8) -> None:
    """Refuse, before allocating, ``copies`` dense n×n arrays for ``what`` when they would take more than half of
    the available memory."""
    need = float(copies) * itemsize * n * n
    have = available_bytes()
    if need > 0.5 * have:
        raise ValidationError(
            f"{what} needs dense {n}×{n} matrices (≈ {human_bytes(need)}); only {human_bytes(have)} of memory is "
            f"available. Dense objects are limited to networks that fit; large networks run sparse (W as an edge "
            f"list) with the algorithms and mechanisms that do not need an n×n matrix (e.g. D-SGD with LDP or "
            f"DP-SGD noise)")


def sparse_bytes(n: int, undirected_edges: int) -> int:
    """Estimated peak bytes of a sparse network: CSR W, the edge arrays and the simulator's edge tensors."""
    directed = 2 * undirected_edges
    return int(directed * (12 + 8 * 4 + 16) + n * (8 * 8 + 32) + 8 * n * 16)


def check_sparse_fits(n: int, undirected_edges: float, what: str) -> None:
    need, have = sparse_bytes(n, int(undirected_edges)), available_bytes()
    if need > 0.8 * have:
        raise ValidationError(
            f"{what}: ≈ {undirected_edges:,.0f} edges on {n:,} agents need ≈ {human_bytes(need)}; only "
            f"{human_bytes(have)} of memory is available (lower p or n)")


# ---- edge arrays ------------------------------------------------------------------------------------------------------
def _check_n(n: object, minimum: int = 1) -> int:
    """The number of agents ``n`` as an int, or the error every topology gives (those of
    :mod:`privdl.network.topology` and the array generators here) when it is not an integer >= ``minimum``."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < minimum:
        raise ValidationError(f"number of agents n must be an integer >= {minimum}, got {n!r}")
    return int(n)


def ring_edges(n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n = _check_n(n, 3)
    i = np.arange(n, dtype=np.int64)
    return i, (i + 1) % n


def path_edges(n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n = _check_n(n, 2)
    i = np.arange(n - 1, dtype=np.int64)
    return i, i + 1


def star_edges(n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n = _check_n(n, 2)
    return np.zeros(n - 1, dtype=np.int64), np.arange(1, n, dtype=np.int64)


def _pairs(n: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The k-th pair (i, j), i < j, of the upper triangle in row-major order (vectorised, exact in int64)."""
    start = lambda i: i * (2 * n - i - 1) // 2  # noqa: E731  index of (i, i + 1)
    b = 2.0 * n - 1.0
    i = np.floor((b - np.sqrt(np.maximum(b * b - 8.0 * k, 0.0))) / 2.0).astype(np.int64)
    i = np.clip(i, 0, n - 2)
    for _ in range(2):  # float rounding: move to the row whose range holds k
        i = np.where(start(i) > k, i - 1, i)
        i = np.where(start(i + 1) <= k, i + 1, i)
    return i, k - start(i) + i + 1


def _chunked_pairs(n: int, k: np.ndarray, chunk: int = 1 << 20) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_pairs` a million at a time, into the index type (int32 while n fits): its float temporaries stay
    small at 10⁷ pairs."""
    index = index_dtype(n)
    i, j = np.empty(len(k), dtype=index), np.empty(len(k), dtype=index)
    for lo in range(0, len(k), chunk):
        i[lo:lo + chunk], j[lo:lo + chunk] = _pairs(n, k[lo:lo + chunk])
    return i, j


def erdos_renyi_edges(n: int, *, p: float, seed: int = 0, connect: str = "resample",
                      max_tries: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """G(n, p) as edge arrays in O(n + E) memory: E ~ Binomial(n(n−1)/2, p), then E distinct pairs uniformly."""
    n = _check_n(n, 1)
    if not 0.0 < p <= 1.0:
        raise ValidationError(f"erdos_renyi edge probability p must be in (0, 1], got {p!r}")
    _check_connect(connect)
    pairs = n * (n - 1) // 2
    check_sparse_fits(n, p * pairs, f"erdos_renyi(n={n}, p={p})")
    isolated = n * (1.0 - p) ** (n - 1)
    if connect == "resample" and isolated > 3.0:  # P(connected) ≈ exp(−isolated) < 5 % a draw
        raise ValidationError(
            f"erdos_renyi(n={n}, p={p}) is almost never connected (≈ {isolated:.0f} isolated agents expected), so "
            f"resampling until it is would not end; raise p above log(n)/n = {math.log(n) / n:.3g}, or set "
            f"[network] connect = \"bridge\" (joins each small component to the largest by one edge)")
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        m = int(rng.binomial(pairs, p))
        chosen = np.empty(0, dtype=np.int64)
        while len(chosen) < m:
            extra = rng.integers(0, pairs, size=int((m - len(chosen)) * 1.05) + 16, dtype=np.int64)
            chosen = np.sort(np.concatenate([chosen, extra]))
            chosen = chosen[np.concatenate([[True], chosen[1:] != chosen[:-1]])]  # np.unique hashes: 8× slower
        if len(chosen) > m:
            chosen = np.sort(rng.choice(chosen, size=m, replace=False))
        i, j = _chunked_pairs(n, chosen)
        del chosen
        if connect == "bridge":
            return bridge(n, i, j, rng)
        if n == 1 or _components(n, i, j)[0] == 1:
            return i, j
    raise ValidationError(f"erdos_renyi(n={n}, p={p}) was disconnected in all {max_tries} draws; increase p or set "
                          f"connect = \"bridge\"")


def _check_connect(connect: str) -> None:
    if connect not in ("resample", "bridge"):
        raise ValidationError(f"connect must be \"resample\" or \"bridge\", got {connect!r}")


def _components(n: int, i: np.ndarray, j: np.ndarray) -> tuple[int, np.ndarray]:
    a = sps.coo_array((np.ones(len(i), dtype=np.int8), (i, j)), shape=(n, n)).tocsr()
    return csgraph.connected_components(a, directed=False)


def bridge(n: int, i: np.ndarray, j: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Join every connected component but the largest to a uniformly chosen agent of the largest, by one edge from
    the component's smallest agent (documented ``connect = "bridge"``)."""
    count, label = _components(n, i, j)
    if count <= 1:
        return i, j
    sizes = np.bincount(label, minlength=count)
    giant = int(np.argmax(sizes))
    members = np.flatnonzero(label == giant)
    first = np.full(count, n, dtype=np.int64)
    np.minimum.at(first, label, np.arange(n, dtype=np.int64))
    others = np.delete(first, giant)
    targets = members[rng.integers(0, len(members), size=len(others))]
    lo, hi = np.minimum(others, targets).astype(i.dtype), np.maximum(others, targets).astype(j.dtype)
    log.info("bridged %d small components to the largest (%d of %d agents)", len(others), len(members), n)
    return np.concatenate([i, lo]), np.concatenate([j, hi])


#: topologies with an array generator (the others are drawn by networkx, then converted)
EDGE_ARRAYS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "ring": ring_edges, "path": path_edges, "star": star_edges, "erdos_renyi": erdos_renyi_edges,
}


# ---- W -----------------------------------------------------------------------------------------------------------------
def _symmetric_pattern(n: int, i: np.ndarray, j: np.ndarray) -> sps.csr_array:
    """The 0/1 adjacency (CSR with int8 data, sorted, no diagonal, duplicates merged) of undirected edges (i, j)."""
    index = index_dtype(max(n, 2 * len(i)))
    keep = i != j
    i, j = np.asarray(i[keep], dtype=index), np.asarray(j[keep], dtype=index)
    rows, cols = np.concatenate([i, j]), np.concatenate([j, i])
    del i, j, keep
    a = sps.coo_array((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n, n)).tocsr()
    del rows, cols
    a.sum_duplicates()
    a.data[:] = 1
    a.sort_indices()
    return a


def _with_diagonal(n: int, indptr: np.ndarray, cols: np.ndarray, rows: np.ndarray, off: np.ndarray,
                   diag: np.ndarray) -> sps.csr_array:
    """The CSR matrix of the off-diagonal entries ``off`` (canonical CSR order, no diagonal) plus ``diag``, built in
    place: in row r the diagonal goes after the r's columns below r, so an off-diagonal entry k moves to
    k + r + [col > r] and the diagonal of row r to indptr[r] + r + #(cols < r in row r)."""
    index = index_dtype(len(off) + n)
    upper = cols > rows
    new_cols = np.empty(len(off) + n, dtype=index)
    data = np.empty(len(off) + n)
    pos = np.arange(len(off), dtype=index)
    pos += rows
    pos += upper
    new_cols[pos], data[pos] = cols, off
    del pos
    below = np.bincount(rows[~upper], minlength=n)
    del upper
    at = indptr[:-1].astype(np.int64) + np.arange(n) + below
    new_cols[at], data[at] = np.arange(n, dtype=index), diag
    w = sps.csr_array((data, new_cols, (indptr.astype(np.int64) + np.arange(n + 1)).astype(index)), shape=(n, n))
    w.has_sorted_indices = True
    w.has_canonical_format = True
    return w


def sparse_mixing(n: int, i: np.ndarray, j: np.ndarray, rule: str, *, lazy: bool = False) -> sps.csr_array:
    """W of the undirected edges (i, j) under ``rule`` (metropolis_hastings, max_degree, laplacian), as CSR (built
    from the edge arrays in O(E) memory: int32 indices while they fit, no n×n object)."""
    a = _symmetric_pattern(n, np.asarray(i), np.asarray(j))
    deg = np.diff(a.indptr)
    rows = np.repeat(np.arange(n, dtype=a.indices.dtype), deg)
    cols = a.indices
    if rule == "metropolis_hastings":
        off = 1.0 / (1.0 + np.maximum(deg[rows], deg[cols]))
    elif rule == "max_degree":
        off = np.full(len(cols), 1.0 / (1.0 + deg.max(initial=0)))
    elif rule == "laplacian":
        off = np.full(len(cols), 1.0 / (deg.max(initial=0) + 1.0))
    elif rule == "uniform":
        raise ValidationError(f"mixing rule 'uniform' needs the complete graph, which is dense; {n} agents are "
                              f"above the dense limit {DENSE_MAX_N}")
    else:
        MIXING_RULES.get(rule)  # an unknown name: the registry's error lists the valid ones
        raise ValidationError(f"mixing rule {rule!r} has no sparse form; sparse networks (n > {DENSE_MAX_N}) take "
                              f"metropolis_hastings, max_degree or laplacian")
    diag = 1.0 - np.bincount(rows, weights=off, minlength=n)
    if lazy:  # (W + I)/2
        off *= 0.5
        diag = 0.5 * (diag + 1.0)
    return _with_diagonal(n, a.indptr, cols, rows, off, diag)


def primitive(w: sps.csr_array, label_count: int) -> bool:
    """For a connected symmetric non-negative W: eigenvalue −1 is absent iff some w_ii > 0 or the graph is not
    bipartite (the period of an irreducible chain without self-loops is 2 iff the graph is bipartite)."""
    if label_count != 1:
        return False
    if np.any(w.diagonal() > 0):
        return True
    n = w.shape[0]
    if n < 2:
        return True
    depth = csgraph.shortest_path(w, indices=0, unweighted=True, directed=False).astype(np.int64)
    coo = w.tocoo()
    return bool(np.any((depth[coo.row] % 2) == (depth[coo.col] % 2)))


def validate_sparse(w: sps.sparray | sps.spmatrix, *, tol: float = TOL) -> sps.csr_array:
    """The sparse counterpart of :func:`privdl.network.validation.validate_mixing_matrix`: square, finite,
    non-negative, rows and columns summing to 1, a symmetric support, connected, primitive (SLEM < 1)."""
    w = sps.csr_array(w, dtype=np.float64)
    w.sum_duplicates()
    w.eliminate_zeros()
    w.sort_indices()
    index = index_dtype(max(w.shape[0], w.nnz))
    if w.indices.dtype != index:  # int32 while it fits: a third less memory for W at 10⁷ entries
        w.indices, w.indptr = w.indices.astype(index), w.indptr.astype(index)
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise ValidationError(f"mixing matrix must be square and non-empty, got shape {w.shape}")
    n = w.shape[0]
    if not np.all(np.isfinite(w.data)):
        raise ValidationError("mixing matrix has a non-finite entry")
    if w.nnz and w.data.min() < -tol:
        raise ValidationError(f"mixing matrix must be non-negative: smallest entry {w.data.min():.3g}")
    for axis, what in ((1, "row"), (0, "column")):
        s = np.asarray(w.sum(axis=axis)).ravel()
        bad = int(np.argmax(np.abs(s - 1.0)))
        if abs(s[bad] - 1.0) > tol:
            raise ValidationError(f"mixing matrix is not doubly stochastic: {what} {bad} sums to {s[bad]:.12g} "
                                  f"(tolerance {tol:g})")
    require_symmetric_support(w)
    count, _ = csgraph.connected_components(w, directed=False)
    if n > 1 and count != 1:
        raise ValidationError(f"graph is disconnected: {count} components")
    if n > 1 and not primitive(w, count):
        raise ValidationError("W has eigenvalue −1 (a bipartite graph with zero diagonal): its second largest "
                              "eigenvalue modulus is 1, so there is no consensus; use a lazy rule")
    return w


__all__ = ["DENSE_MAX_N", "EDGE_ARRAYS", "available_bytes", "bridge", "check_sparse_fits", "erdos_renyi_edges",
           "human_bytes", "primitive", "require_dense", "sparse_mixing", "validate_sparse"]
