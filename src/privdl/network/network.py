"""The :class:`Network`: graph + validated mixing matrix + spectral facts (static facts only).

Algorithms never touch W: they talk through a :class:`privdl.comm.Comm` built from the network, and may read only
their own incoming edge weights (``comm.edges``).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import networkx as nx
import numpy as np
import scipy.sparse as sps

from privdl.errors import PrivdlError, ValidationError
from privdl.network.edges import Edges, fingerprint, graph_arrays, laplacian
from privdl.network.mixing import mixing_matrix
from privdl.network.sparse import (
    DENSE_MAX_N,
    EDGE_ARRAYS,
    check_sparse_fits,
    log,
    require_dense,
    sparse_mixing,
    validate_sparse,
)
from privdl.network.topology import TOPOLOGIES, make_graph
from privdl.network.validation import require_symmetric_support, slem, support_graph, validate_mixing_matrix


class Network:
    """An undirected communication graph with a validated, doubly stochastic mixing matrix W.

    Up to :data:`~privdl.network.sparse.DENSE_MAX_N` agents W is a dense array; above it, a ``scipy.sparse``
    CSR array built from edge arrays (``network.sparse``), the graph is made only when asked for, and every dense
    object (``dense()``, the Laplacian, spectra) is refused up front when it would not fit in memory."""

    #: False: undirected (:class:`privdl.network.directed.DirectedNetwork` is the directed kind)
    directed = False
    #: the law of W(t) on a time-varying graph (:class:`privdl.network.dynamics.Dynamics`), None for one W: the
    #: network is then the reference graph (the union of the law's graphs) and the rounds mix with W(t)
    dynamics = None

    def __init__(self, W: np.ndarray | sps.sparray, graph: nx.Graph | None = None,
                 description: str = "custom") -> None:
        self.description = description
        if sps.issparse(W):
            self.W = validate_sparse(W)
            if graph is not None and graph.number_of_nodes() != self.W.shape[0]:
                raise ValidationError(f"mixing matrix is {self.W.shape[0]}×{self.W.shape[0]} but the graph has "
                                      f"{graph.number_of_nodes()} nodes")
        else:
            self.W = validate_mixing_matrix(W, graph)
        self._graph = graph

    # ---- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_topology(
        cls, topology: str, n: int, *, mixing: str = "metropolis_hastings", lazy: bool = False, seed: int = 0,
        **params: object,
    ) -> "Network":
        if topology.startswith("directed_"):
            raise ValidationError(f"topology {topology!r} is directed: build it with DirectedNetwork.from_topology "
                                  "(privdl.network.directed), or [network] directed = true in a config")
        desc = f"{topology}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))}) n={n} {mixing}"
        desc += " lazy" if lazy else ""
        if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n > DENSE_MAX_N:
            TOPOLOGIES.get(topology)  # an unknown name: the registry's error
            log.info("building %s with %s agents (sparse W)", topology, f"{n:,}")
            if topology in EDGE_ARRAYS:
                i, j = EDGE_ARRAYS[topology](n, seed=seed, **params)
            else:
                _, i, j = graph_arrays(make_graph(topology, n, seed=seed, **params))
            return cls.from_edges(n, i, j, mixing=mixing, lazy=lazy, description=desc)
        graph = make_graph(topology, n, seed=seed, **params)
        w = mixing_matrix(graph, mixing, lazy_=lazy)
        return cls(w, graph, desc)

    @classmethod
    def from_edges(cls, n: int, i: np.ndarray, j: np.ndarray | None = None, *, mixing: str = "metropolis_hastings",
                   lazy: bool = False, description: str | None = None) -> "Network":
        """A network of ``n`` agents (0..n-1) from its undirected edges: an edge list ``[(i, j), ...]`` (``j``
        left out), or two arrays of endpoints ``i`` and ``j``; weights by the ``mixing`` rule (``lazy``: (I + W)/2).
        Sparse W above DENSE_MAX_N agents."""
        if j is None:
            pairs = np.asarray(i)
            if pairs.size == 0:
                pairs = pairs.reshape(0, 2).astype(np.int64)
            if pairs.ndim != 2 or pairs.shape[1] != 2:
                raise ValidationError(f"an edge list is a sequence of (i, j) pairs, got an array of shape "
                                      f"{pairs.shape}")
            i, j = pairs[:, 0], pairs[:, 1]
        i, j = np.asarray(i), np.asarray(j)
        if i.shape != j.shape or i.ndim != 1 or not (np.issubdtype(i.dtype, np.integer) or i.size == 0) \
                or not (np.issubdtype(j.dtype, np.integer) or j.size == 0):
            raise ValidationError(f"edge arrays must be two 1-d integer arrays of one length, got {i.dtype}{i.shape} "
                                  f"and {j.dtype}{j.shape}")
        if len(i) and (min(i.min(), j.min()) < 0 or max(i.max(), j.max()) >= n):
            raise ValidationError(f"edge endpoints must lie in 0..{n - 1}")
        description = description or f"edges n={n} {mixing}"
        if n <= DENSE_MAX_N:
            g = nx.empty_graph(n)
            g.add_edges_from(zip(i.tolist(), j.tolist()))
            g.remove_edges_from(nx.selfloop_edges(g))
            return cls(mixing_matrix(g, mixing, lazy_=lazy), g, description)
        check_sparse_fits(n, len(i), description)
        w = sparse_mixing(n, i, j, mixing, lazy=lazy)
        net = cls(w, None, description)
        log.info("built %s: %s edges", description, f"{len(net.edges) // 2:,}")
        return net

    @classmethod
    def from_graph(cls, graph: nx.Graph, *, mixing: str = "metropolis_hastings", lazy: bool = False) -> "Network":
        graph = nx.convert_node_labels_to_integers(graph, ordering="sorted")
        n = graph.number_of_nodes()
        if n > DENSE_MAX_N:
            _, i, j = graph_arrays(graph)
            return cls.from_edges(n, i, j, mixing=mixing, lazy=lazy, description=f"graph n={n} {mixing}")
        return cls(mixing_matrix(graph, mixing, lazy_=lazy), graph, f"graph n={n} {mixing}")

    @classmethod
    def from_matrix(cls, w: np.ndarray, description: str = "user W") -> "Network":
        """A network from a user-supplied W; the graph is W's support. W is validated."""
        if sps.issparse(w):
            return cls(w, None, description)
        w = validate_mixing_matrix(w)
        return cls(w, support_graph(w), description)

    # ---- facts --------------------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.W.shape[0]

    @property
    def sparse(self) -> bool:
        """True when W is kept as a sparse (CSR) matrix."""
        return sps.issparse(self.W)

    @property
    def graph(self) -> nx.Graph:
        """The graph as networkx (made on first use for a sparse network: avoid it at 10⁶ agents)."""
        if self._graph is None:
            g = nx.empty_graph(self.n)
            e = self.edges
            keep = e.src < e.dst
            g.add_edges_from(zip(e.src[keep].tolist(), e.dst[keep].tolist()))
            self._graph = g
        return self._graph

    def dense(self, what: str = "this computation", *, copies: int = 1) -> np.ndarray:
        """W as a dense array; for a sparse network refused, with the memory it would need, when ``copies`` n×n
        arrays (what the caller will make of it) would not fit."""
        if not self.sparse:
            return self.W
        require_dense(self.n, what, copies=copies)
        return self.W.toarray()

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 (first 16 hex digits) of W rounded to 12 decimals: identifies W in manifests and caches
        (a sparse W hashes its CSR structure instead, so the two kinds never share a fingerprint)."""
        return fingerprint(self.W)

    @cached_property
    def laplacian(self) -> np.ndarray:
        """Unweighted graph Laplacian D − A."""
        return laplacian(self.dense("the graph Laplacian") if self.sparse else self.graph)

    @cached_property
    def edges(self) -> Edges:
        """Every directed edge j → i with its weight w_ij, in canonical order (receiver, then sender)."""
        return Edges.from_matrix(self.W)

    @cached_property
    def fiedler_value(self) -> float:
        """Algebraic connectivity λ₂ of the unweighted Laplacian."""
        return _smallest_but_one(self.laplacian)

    @property
    def normalized_fiedler_value(self) -> float:
        """λ₂ / n (seed 004): 1 for the complete graph."""
        return self.fiedler_value / self.n

    @cached_property
    def symmetric_spectrum(self) -> np.ndarray | None:
        """W's eigenvalues when W is symmetric (one decomposition serves λ₂(WᵀW) and the SLEM), else None."""
        w = self.dense("W's spectrum")
        return np.linalg.eigvalsh(w) if np.allclose(w, w.T, atol=1e-12) else None

    @cached_property
    def lambda2_WtW(self) -> float:
        """Second largest eigenvalue of WᵀW (the largest is 1); for symmetric W the squares of W's eigenvalues."""
        if self.n < 2:
            return 0.0
        ev = self.symmetric_spectrum
        w = self.dense("W's spectrum")
        ev = np.sort(ev * ev) if ev is not None else np.linalg.eigvalsh(w.T @ w)
        return float(ev[-2])

    @cached_property
    def slem(self) -> float:
        """Second largest eigenvalue modulus (W's eigenvalue 1 is simple on a connected graph)."""
        if self.n < 2:
            return 0.0
        ev = self.symmetric_spectrum
        return float(np.sort(np.abs(ev))[-2]) if ev is not None else slem(self.dense("W's spectrum"))

    @property
    def spectral_gap(self) -> float:
        """1 − second largest eigenvalue modulus of W."""
        return 1.0 - self.slem

    def degrees(self) -> np.ndarray:
        return self.edges.degree.numpy()

    def neighbours(self, i: int) -> list[int]:
        if self.sparse:
            row = self.W.indices[self.W.indptr[i]:self.W.indptr[i + 1]]
            return sorted(int(j) for j in row if j != i)
        return sorted(self.graph.neighbors(i))

    def facts(self) -> dict[str, float | int | str | None]:
        """Spectral and structural facts, as recorded in manifests (a sparse network's spectral facts are None:
        an eigen-decomposition of 10⁶ agents is not part of building it)."""
        base = {"n": self.n, "edges": len(self.edges) // 2, "description": self.description,
                "fingerprint": self.fingerprint}
        if self.sparse:
            return {**base, "representation": "sparse", "lambda2_WtW": None, "spectral_gap": None,
                    "fiedler_value": None, "normalized_fiedler_value": None}
        return {
            **base,
            "lambda2_WtW": self.lambda2_WtW,
            "spectral_gap": self.spectral_gap,
            "fiedler_value": self.fiedler_value,
            "normalized_fiedler_value": self.normalized_fiedler_value,
        }

    def mix(self, *_: object, **__: object) -> None:
        raise PrivdlError("Network.mix was removed: agents talk through a Comm, e.g. "
                          "privdl.comm.make_comm(network).mix(x, tag=...) (see privdl.comm)")


def fiedler_value(graph: nx.Graph) -> float:
    n = graph.number_of_nodes()
    if n < 2:
        return 0.0
    return _smallest_but_one(laplacian(nx.convert_node_labels_to_integers(graph, ordering="sorted")))


def _smallest_but_one(lap: np.ndarray) -> float:
    return float(np.linalg.eigvalsh(lap)[1]) if len(lap) > 1 else 0.0


def load_network_file(path: str | Path, *, kind: str = "auto", mixing: str = "metropolis_hastings",
                      lazy: bool = False) -> Network:
    """Load a network from ``path`` (.npy, or a text table: .csv, .txt; commas or white space, ``#`` comments).

    ``kind``: ``"edges"`` (two integer columns i j: one undirected edge per row, agents numbered from 0),
    ``"adjacency"`` (0/1 symmetric matrix; ``mixing`` builds W), ``"mixing"`` (W itself, validated) or ``"auto"``:
    a square 0/1 matrix with zero diagonal is an adjacency matrix; a two-column table is an edge list — with two
    rows too when it holds integers (a 2×2 integer matrix is never a valid W, and "0 1 / 1 2" is the path of three
    agents, not a 2×2 W); any other square matrix is W. Every error names the file; a W or an adjacency whose
    support is not symmetric is refused with an offending pair
    (:func:`~privdl.network.validation.require_symmetric_support`).
    """
    from privdl.data.files import read_matrix

    path = Path(path)
    if kind not in ("auto", "edges", "adjacency", "mixing"):
        raise ValidationError(f"unknown network file kind {kind!r}; valid: auto, edges, adjacency, mixing")
    arr = read_matrix(path, "network file")
    if arr.ndim != 2:
        raise ValidationError(f"network file {path} holds {_shape_words(arr)}; a network file holds a matrix (W or "
                              "an adjacency, n×n) or an edge list (two integer columns)")
    integer = bool(np.all(arr == np.round(arr)))
    weighted = arr.shape[1] == 3 and bool(np.all(arr[:, :2] == np.round(arr[:, :2]))) and arr[:, :2].min() >= 0
    looks_like = ("adjacency" if arr.shape[0] == arr.shape[1] and np.all(np.isin(arr, (0.0, 1.0)))
                  and not arr.diagonal().any() else "edges" if arr.shape[1] == 2 and (integer or arr.shape[0] != 2)
                  else "weighted" if weighted else "mixing")
    if kind == "auto":
        kind = "mixing" if looks_like == "weighted" else looks_like
        if kind == "mixing" and arr.shape[0] != arr.shape[1]:
            raise ValidationError(
                f"network file {path} holds a {arr.shape[0]}×{arr.shape[1]} table: not square (W, adjacency) and "
                + ("not two columns (an edge list)" if not weighted else
                   "three columns: an edge list has two (weighted edge lists i j w are not read; give W itself)"))
    try:
        if kind == "edges":
            return _edge_list(arr, path, mixing=mixing, lazy=lazy)
        if kind == "adjacency":
            if arr.shape[0] != arr.shape[1]:
                raise ValidationError(f"an adjacency matrix must be square, got {arr.shape[0]}×{arr.shape[1]}")
            require_symmetric_support(arr, what="adjacency matrix", symbol="A")
            other = np.argwhere(~np.isin(arr, (0.0, 1.0)))
            if len(other):
                i, j = (int(k) for k in other[0])
                raise ValidationError(f"an adjacency matrix holds 0 and 1, this one A[{i},{j}] = {arr[i, j]:g} "
                                      "(a mixing matrix W? file_kind = \"mixing\")")
            return Network.from_graph(nx.from_numpy_array(arr), mixing=mixing, lazy=lazy)
        return Network.from_matrix(arr, description=f"W from {path.name}")
    except ValidationError as exc:
        hint = ""
        if kind == "mixing" and looks_like != "mixing":
            said = {"edges": "an edge list", "adjacency": "an adjacency matrix",
                    "weighted": "a weighted edge list i j w, which privdl does not read"}[looks_like]
            hint = f" (it looks like {said}; this file must hold the n×n mixing matrix W itself)"
        raise type(exc)(f"network file {path}: {exc}{hint}") from None


def _shape_words(arr: np.ndarray) -> str:
    if arr.ndim == 0:
        return "a single number"
    if arr.ndim == 1:
        return f"a 1-d array of {arr.shape[0]} numbers"
    return f"a {arr.ndim}-d array of shape {arr.shape}"


def _edge_list(arr: np.ndarray, path: Path, *, mixing: str, lazy: bool) -> Network:
    """The network of an edge list (one undirected edge i j per row, agents 0..n−1 with n = the largest + 1; a
    self-loop i i adds nothing: W's diagonal is the mixing rule's)."""
    if arr.shape[1] != 2:
        raise ValidationError(f"an edge list has two columns (i j), this one {arr.shape[1]}")
    bad = np.argwhere((arr != np.round(arr)) | (arr < 0) | (arr >= 2**40))
    if len(bad):
        r, c = (int(k) for k in bad[0])
        raise ValidationError(f"row {r + 1}, column {c + 1} is {arr[r, c]:g}: edge lists name agents by "
                              "non-negative integers (from 0, below 2^40)")
    edges = arr.astype(np.int64)
    n = int(edges.max()) + 1
    try:
        return Network.from_edges(n, edges[:, 0], edges[:, 1], mixing=mixing, lazy=lazy,
                                  description=f"graph n={n} {mixing}")
    except ValidationError as exc:
        if "disconnected" not in str(exc):  # (a graph was built: n agents fit in memory)
            raise
        named = np.zeros(n, dtype=bool)
        named[edges[edges[:, 0] != edges[:, 1]].ravel()] = True
        lonely = np.flatnonzero(~named)
        if not len(lonely):
            raise
        hint = " — numbered from 1? agents are numbered from 0" if lonely[0] == 0 else ""
        raise ValidationError(f"{exc}; agents {lonely[:10].tolist()} are in no edge (the agents are 0..{n - 1}, "
                              f"by the largest index{hint})") from None


def erdos_renyi_with_normalized_fiedler(
    n: int, target: float, *, tol: float = 0.02, mixing: str = "metropolis_hastings", seed: int = 0,
    draws_per_p: int = 8, max_bisections: int = 40,
) -> Network:
    """A connected ER graph whose normalized Fiedler value λ₂/n lies within ``tol`` of ``target`` (seed 004).

    Bisection over p on sampled graphs; at each p several seeded draws are tried and the closest one kept.
    """
    if not 0.0 < target <= 1.0:
        raise ValidationError(f"target normalized Fiedler value must be in (0, 1], got {target}")
    if target >= 1.0 - tol:
        return Network.from_topology("complete", n, mixing=mixing)
    rng = np.random.default_rng(seed)
    lo, hi = 0.0, 1.0
    best: tuple[float, nx.Graph | None] = (np.inf, None)
    for _ in range(max_bisections):
        p = 0.5 * (lo + hi)
        values = []
        for _ in range(draws_per_p):
            g = nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31 - 1)))
            if not nx.is_connected(g):
                values.append(0.0)
                continue
            v = fiedler_value(g) / n
            values.append(v)
            if abs(v - target) < best[0]:
                best = (abs(v - target), g)
            if abs(v - target) <= tol:
                net = Network.from_graph(g, mixing=mixing)
                net.description = f"erdos_renyi(p={p:.4f}) n={n} normalized_fiedler={v:.4f} {mixing}"
                return net
        if np.median(values) < target:
            lo = p
        else:
            hi = p
    raise ValidationError(
        f"no connected ER graph on {n} agents with normalized Fiedler value within {tol} of {target} "
        f"(closest: off by {best[0]:.4f}); widen the tolerance"
    )


def fiedler_target_graph(n: int, *, fiedler: float, tol: float = 0.02, seed: int = 0) -> nx.Graph:
    """Topology ``fiedler``: a connected Erdős–Rényi graph with normalized Fiedler value λ₂/n within ``tol`` of
    ``fiedler`` (seed 004's connectivity axis; 1 gives the complete graph)."""
    return erdos_renyi_with_normalized_fiedler(n, fiedler, tol=tol, seed=seed).graph


TOPOLOGIES.add("fiedler", fiedler_target_graph)
