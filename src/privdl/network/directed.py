"""Directed networks (issue 46, item 2): a digraph with column-stochastic push-sum weights.

An edge i → j means agent i sends to agent j. ``mixing = "push_sum"`` (the only rule on a directed network): every
agent splits its mass equally over its out-neighbours and itself,

    A[j, i] = 1 / (outdeg(i) + 1)    for j ∈ out(i) ∪ {i},   0 elsewhere,

so every column of A sums to 1 (A is column stochastic: Σ_i x_i is preserved by x ← A x) while its rows need not.
Rows are receivers and columns senders, as everywhere in privdl: ``comm.mix(x)`` computes Σ_j A[i, j] x_j over i's
incoming edges, so the simulator's Comms, the sliced backend and the canonical summation order apply unchanged.

A directed network must be **strongly connected** (every agent reaches every other along directed edges): then A,
whose diagonal is positive, is primitive, A^t → π 1ᵀ with π > 0 its Perron vector, and push-sum's ratio x / w reaches
the exact average. A graph that is not is refused, naming an agent that cannot reach another.

What an undirected :class:`~privdl.network.network.Network` guarantees (symmetric support, doubly stochastic W,
reverse edges) does not hold here, and nothing that needs it may run on a :class:`DirectedNetwork`: the build refuses
algorithms without ``Algorithm.directed_ok`` and mechanisms without ``directed_ok`` (:func:`check_directed`).
Directed networks are dense (up to :data:`~privdl.network.sparse.DENSE_MAX_N` agents).
"""

from __future__ import annotations

import hashlib
from collections import deque
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import torch

from privdl.errors import ValidationError
from privdl.network.edges import Edges, index_dtype
from privdl.network.network import Network
from privdl.network.sparse import DENSE_MAX_N, _check_n
from privdl.network.topology import MAX_TRIES, TOPOLOGIES
from privdl.network.validation import TOL

#: the one mixing rule of a directed network
PUSH_SUM = "push_sum"
#: topologies whose graphs are directed (a ``networkx.DiGraph``); every other topology is undirected, and with
#: ``directed = true`` becomes the digraph with both directions of each edge
DIRECTED_TOPOLOGIES = ("directed_ring", "directed_erdos_renyi")


# ---- topologies -----------------------------------------------------------------------------------------------------
@TOPOLOGIES.register("directed_ring")
def directed_ring(n: int, *, seed: int = 0) -> nx.DiGraph:
    """The directed cycle 0 → 1 → … → n−1 → 0 (strongly connected; each agent sends to one agent)."""
    _check_n(n, 2)
    return nx.cycle_graph(n, create_using=nx.DiGraph)


@TOPOLOGIES.register("directed_erdos_renyi")
def directed_erdos_renyi(n: int, *, p: float, seed: int = 0) -> nx.DiGraph:
    """Directed Erdős–Rényi: each ordered pair (i, j), i ≠ j, is an edge i → j with probability ``p``,
    independently. **Redrawn** (from the seed's RNG, at most MAX_TRIES times) until strongly connected, like
    ``erdos_renyi``'s default ``connect = "resample"``; an error after that many draws."""
    _check_n(n, 2)
    if not (isinstance(p, (int, float)) and not isinstance(p, bool) and 0.0 < p <= 1.0):
        raise ValidationError(f"directed_erdos_renyi edge probability p must be in (0, 1], got {p!r}")
    rng = np.random.default_rng(seed)
    for _ in range(MAX_TRIES):
        g = nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31 - 1)), directed=True)
        if nx.is_strongly_connected(g):
            return g
    raise ValidationError(f"directed_erdos_renyi(n={n}, p={p}) was not strongly connected in any of {MAX_TRIES} "
                          "draws; increase p")


# ---- weights and checks ---------------------------------------------------------------------------------------------
def out_adjacency(graph: nx.DiGraph) -> np.ndarray:
    """S[j, i] = 1 for each edge i → j (i ≠ j): rows receivers, columns senders (self-loops dropped)."""
    n = graph.number_of_nodes()
    s = np.zeros((n, n))
    for i, j in graph.edges():
        if i != j:
            s[j, i] = 1.0
    return s


def push_sum_matrix(graph: nx.DiGraph) -> np.ndarray:
    """A[j, i] = 1/(outdeg(i) + 1) for j ∈ out(i) ∪ {i}: column stochastic (module doc)."""
    a = out_adjacency(graph) + np.eye(graph.number_of_nodes())
    return a / a.sum(axis=0, keepdims=True)


def unreachable(support: np.ndarray) -> tuple[int, int] | None:
    """(a, b) with agent a unable to reach agent b along the edges of ``support`` (support[j, i] ≠ 0: i → j), or
    None when the digraph is strongly connected. Two breadth-first searches from agent 0 (forward and backward)."""
    n = len(support)
    if n < 2:
        return None
    s = support != 0
    for forward in (True, False):
        seen = np.zeros(n, dtype=bool)
        seen[0] = True
        todo = deque([0])
        while todo:
            k = todo.popleft()
            nxt = np.flatnonzero(s[:, k] if forward else s[k, :])  # out-neighbours of k, or its in-neighbours
            new = nxt[~seen[nxt]]
            seen[new] = True
            todo.extend(new.tolist())
        if not seen.all():
            b = int(np.flatnonzero(~seen)[0])
            return (0, b) if forward else (b, 0)
    return None


def require_strongly_connected(support: np.ndarray, what: str = "directed graph") -> None:
    pair = unreachable(support)
    if pair is not None:
        a, b = pair
        raise ValidationError(f"{what} is not strongly connected: node {a} cannot reach node {b} along directed "
                              "edges (push-sum needs every agent to reach every other)")


def validate_column_stochastic(a: np.ndarray, *, tol: float = TOL) -> np.ndarray:
    """A valid directed mixing matrix: square, finite, non-negative, positive diagonal, columns summing to 1,
    strongly connected support (A[j, i] > 0: edge i → j). Returns it as float64."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
        raise ValidationError(f"a directed mixing matrix must be square and non-empty, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        i, j = np.argwhere(~np.isfinite(a))[0]
        raise ValidationError(f"directed mixing matrix has a non-finite entry A[{i},{j}] = {a[i, j]}")
    if a.min() < -tol:
        i, j = np.unravel_index(np.argmin(a), a.shape)
        raise ValidationError(f"directed mixing matrix must be non-negative: A[{i},{j}] = {a[i, j]:.3g}")
    cols = np.abs(a.sum(axis=0) - 1.0)
    if cols.max() > tol:
        j = int(np.argmax(cols))
        raise ValidationError(f"directed mixing matrix is not column stochastic: column {j} (what agent {j} sends) "
                              f"sums to {a[:, j].sum():.12g} (tolerance {tol:g})")
    diag = np.diag(a)
    if diag.min() <= 0:
        i = int(np.argmin(diag))
        raise ValidationError(f"directed mixing matrix needs a positive diagonal (each agent keeps a share of its "
                              f"mass): A[{i},{i}] = {diag[i]:g}")
    off = np.where(np.abs(a) > tol, a, 0.0)
    np.fill_diagonal(off, 0.0)
    require_strongly_connected(off)
    return a


def directed_edges_of(a: np.ndarray) -> Edges:
    """Every edge i → j (A[j, i] ≠ 0, i ≠ j) in canonical order (receiver, then sender), weight A[j, i]. A directed
    graph has no reverse edges: ``reverse`` is −1 throughout (``comm.push`` needs it: no algorithm that pushes is
    ``directed_ok``)."""
    n = a.shape[0]
    off = a != 0
    np.fill_diagonal(off, False)
    dst, src = np.nonzero(off)  # row-major: by receiver, then sender
    index = index_dtype(max(n, len(src)))
    src, dst = src.astype(index), dst.astype(index)
    return Edges(torch.as_tensor(src), torch.as_tensor(dst), torch.as_tensor(a[dst, src]),
                 torch.full((len(src),), -1, dtype=torch.as_tensor(src).dtype), torch.as_tensor(np.diag(a).copy()),
                 n)


# ---- the network ----------------------------------------------------------------------------------------------------
class DirectedNetwork(Network):
    """A strongly connected digraph with a column-stochastic mixing matrix A (``self.W``; module doc)."""

    directed = True

    def __init__(self, W: np.ndarray, graph: nx.DiGraph | None = None, description: str = "custom directed") -> None:
        self.description = description
        if not isinstance(W, np.ndarray):
            raise ValidationError("a directed network's mixing matrix is a dense numpy array (no sparse W)")
        if W.shape[0] > DENSE_MAX_N:
            raise ValidationError(f"directed networks are dense: at most {DENSE_MAX_N} agents, got {W.shape[0]}")
        self.W = validate_column_stochastic(W)
        if graph is not None:
            if graph.number_of_nodes() != self.W.shape[0]:
                raise ValidationError(f"mixing matrix is {self.W.shape[0]}×{self.W.shape[0]} but the graph has "
                                      f"{graph.number_of_nodes()} nodes")
            s = out_adjacency(graph)
            off = self.W.copy()
            np.fill_diagonal(off, 0.0)
            bad = np.argwhere((off > TOL) & (s == 0))
            if len(bad):
                j, i = (int(k) for k in bad[0])
                raise ValidationError(f"directed mixing matrix has weight A[{j},{i}] = {off[j, i]:.3g} on a pair "
                                      f"that is not an edge {i} → {j}")
        self._graph = graph

    # ---- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_graph(cls, graph: nx.Graph, *, mixing: str = PUSH_SUM, lazy: bool = False,
                   description: str | None = None) -> "DirectedNetwork":
        """The push-sum network of a digraph (an undirected graph: both directions of each edge)."""
        check_mixing(mixing, lazy)
        graph = nx.convert_node_labels_to_integers(graph, ordering="sorted")
        g = graph if graph.is_directed() else graph.to_directed()
        g.remove_edges_from(list(nx.selfloop_edges(g)))
        n = g.number_of_nodes()
        if n > DENSE_MAX_N:
            raise ValidationError(f"directed networks are dense: at most {DENSE_MAX_N} agents, got {n}")
        a = push_sum_matrix(g)
        require_strongly_connected(out_adjacency(g))
        return cls(a, g, description or f"directed graph n={n} {PUSH_SUM}")

    @classmethod
    def from_topology(cls, topology: str, n: int, *, mixing: str | None = None, lazy: bool = False, seed: int = 0,
                      **params: object) -> "DirectedNetwork":
        from privdl.network.topology import make_graph

        mixing = mixing or PUSH_SUM
        check_mixing(mixing, lazy)
        desc = f"{topology}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))}) n={n} {mixing} directed"
        return cls.from_graph(make_graph(topology, n, seed=seed, **params), mixing=mixing, description=desc)

    @classmethod
    def from_edges(cls, n: int, i: np.ndarray, j: np.ndarray | None = None, *, mixing: str = PUSH_SUM,
                   lazy: bool = False, description: str | None = None) -> "DirectedNetwork":
        """Agents 0..n−1 and directed edges i[k] → j[k] (or a list of (i, j) pairs with ``j`` left out)."""
        if j is None:
            pairs = np.asarray(i, dtype=np.int64).reshape(-1, 2)
            i, j = pairs[:, 0], pairs[:, 1]
        i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
        if len(i) and (min(i.min(), j.min()) < 0 or max(i.max(), j.max()) >= n):
            raise ValidationError(f"edge endpoints must lie in 0..{n - 1}")
        g = nx.empty_graph(n, create_using=nx.DiGraph)
        g.add_edges_from(zip(i.tolist(), j.tolist()))
        return cls.from_graph(g, mixing=mixing, lazy=lazy,
                              description=description or f"edges n={n} {mixing} directed")

    @classmethod
    def from_matrix(cls, w: np.ndarray, description: str = "user A (directed)") -> "DirectedNetwork":
        """A user-given column-stochastic A (validated); the graph is its support (A[j, i] ≠ 0: edge i → j)."""
        a = validate_column_stochastic(w)
        g = nx.empty_graph(len(a), create_using=nx.DiGraph)
        dst, src = np.nonzero(a)
        g.add_edges_from((int(s), int(d)) for s, d in zip(src, dst) if s != d)
        return cls(a, g, description)

    # ---- facts --------------------------------------------------------------------------------------------------
    @property
    def graph(self) -> nx.DiGraph:
        if self._graph is None:
            g = nx.empty_graph(self.n, create_using=nx.DiGraph)
            e = self.edges
            g.add_edges_from(zip(e.src.tolist(), e.dst.tolist()))
            self._graph = g
        return self._graph

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 (16 hex digits) of "directed" and A rounded to 12 decimals: never equal to an undirected W's
        (a symmetric A, e.g. the directed=true ring, is also a doubly stochastic W)."""
        payload = b"directed" + repr(self.W.shape).encode() + np.round(self.W, 12).astype("<f8").tobytes()
        return hashlib.sha256(payload).hexdigest()[:16]

    @cached_property
    def edges(self) -> Edges:
        """Every directed edge i → j with weight A[j, i], in canonical order; no reverse edges (−1)."""
        return directed_edges_of(self.W)

    @cached_property
    def perron(self) -> np.ndarray:
        """π: A π = π, Σ π = 1, π > 0 (the limit of push-sum's weights w_t / n)."""
        ev, vec = np.linalg.eig(self.W)
        k = int(np.argmin(np.abs(ev - 1.0)))
        v = np.real(vec[:, k])
        return v / v.sum()

    @cached_property
    def slem(self) -> float:
        """Second largest eigenvalue modulus of A (its eigenvalue 1 is simple: strongly connected, positive
        diagonal)."""
        if self.n < 2:
            return 0.0
        return float(np.sort(np.abs(np.linalg.eigvals(self.W)))[-2])

    @property
    def symmetric_spectrum(self) -> None:
        return None

    def _undirected(self, what: str):
        raise ValidationError(f"{what} is a fact of undirected graphs; this network is directed")

    @property
    def laplacian(self) -> np.ndarray:  # type: ignore[override]
        self._undirected("the graph Laplacian")

    @property
    def fiedler_value(self) -> float:  # type: ignore[override]
        self._undirected("the Fiedler value")

    @property
    def lambda2_WtW(self) -> float:  # type: ignore[override]
        self._undirected("λ₂(WᵀW) (seed 004's mixing bound)")

    def out_degrees(self) -> np.ndarray:
        return np.bincount(self.edges.src.numpy(), minlength=self.n)

    def degrees(self) -> np.ndarray:
        """In-degrees (the senders each agent hears)."""
        return self.edges.degree.numpy()

    def neighbours(self, i: int) -> list[int]:
        """The agents i hears (in-neighbours)."""
        return sorted(self.graph.predecessors(i))

    def out_neighbours(self, i: int) -> list[int]:
        return sorted(self.graph.successors(i))

    def facts(self) -> dict[str, Any]:
        return {"n": self.n, "edges": len(self.edges), "description": self.description,
                "fingerprint": self.fingerprint, "directed": True, "mixing": PUSH_SUM,
                "lambda2_WtW": None, "spectral_gap": 1.0 - self.slem, "fiedler_value": None,
                "normalized_fiedler_value": None}


def check_mixing(mixing: str, lazy: bool = False) -> None:
    if mixing != PUSH_SUM:
        raise ValidationError(f"a directed network mixes by {PUSH_SUM!r} (column stochastic: each agent splits its "
                              f"mass over its out-neighbours and itself); mixing rule {mixing!r} is for undirected "
                              "graphs (symmetric, doubly stochastic)")
    if lazy:
        raise ValidationError("lazy = true is (I + W)/2 for undirected W; a directed network's push-sum weights "
                              "already keep a share at every agent: remove lazy")


def is_directed(network: object) -> bool:
    return bool(getattr(network, "directed", False))


def load_directed_file(path: str | Path, *, kind: str = "auto", mixing: str = PUSH_SUM,
                       lazy: bool = False) -> DirectedNetwork:
    """A directed network from a file: ``edges`` (two integer columns i j: an edge i → j per row, agents from 0,
    n = the largest + 1), ``adjacency`` (S[i, j] = 1: edge i → j, zero diagonal) or ``mixing`` (A itself, column
    stochastic, rows receivers); ``auto`` as for undirected files, a non-symmetric square 0/1 matrix included."""
    from privdl.data.files import read_matrix

    path = Path(path)
    check_mixing(mixing, lazy)
    if kind not in ("auto", "edges", "adjacency", "mixing"):
        raise ValidationError(f"unknown network file kind {kind!r}; valid: auto, edges, adjacency, mixing")
    arr = read_matrix(path, "network file")
    if arr.ndim != 2:
        raise ValidationError(f"network file {path} holds an array of {arr.ndim} dimensions; a directed network "
                              "file holds an edge list (two integer columns i j: i → j) or an n×n matrix")
    if kind == "auto":
        square01 = arr.shape[0] == arr.shape[1] and np.all(np.isin(arr, (0.0, 1.0))) and not arr.diagonal().any()
        kind = "adjacency" if square01 else "edges" if arr.shape[1] == 2 else "mixing"
    try:
        if kind == "edges":
            if arr.shape[1] != 2:
                raise ValidationError(f"an edge list has two columns (i j: an edge i → j), this one {arr.shape[1]}")
            bad = np.argwhere((arr != np.round(arr)) | (arr < 0))
            if len(bad):
                r, c = (int(k) for k in bad[0])
                raise ValidationError(f"row {r + 1}, column {c + 1} is {arr[r, c]:g}: edge lists name agents by "
                                      "non-negative integers (from 0)")
            e = arr.astype(np.int64)
            n = int(e.max()) + 1 if e.size else 0
            return DirectedNetwork.from_edges(n, e[:, 0], e[:, 1], description=f"{path.name} n={n} push_sum directed")
        if kind == "adjacency":
            if arr.shape[0] != arr.shape[1] or not np.all(np.isin(arr, (0.0, 1.0))):
                raise ValidationError("an adjacency matrix is square and holds 0 and 1 (S[i, j] = 1: edge i → j)")
            g = nx.from_numpy_array(arr, create_using=nx.DiGraph)
            return DirectedNetwork.from_graph(g, description=f"{path.name} n={len(arr)} push_sum directed")
        return DirectedNetwork.from_matrix(arr, description=f"A from {path.name} (directed)")
    except ValidationError as exc:
        raise ValidationError(f"network file {path}: {exc}") from None




# ---- the [network] table ------------------------------------------------------------------------------------------
def wants_directed(net: dict) -> bool:
    """Whether a ``[network]`` table describes a directed network: ``directed = true``, or a directed topology
    (``directed_ring``, ``directed_erdos_renyi``: directed whatever ``directed`` says, and ``directed = false`` with
    one is refused), or ``mixing = "push_sum"`` — refused without ``directed = true`` (push-sum is column stochastic,
    not the doubly stochastic W an undirected network validates)."""
    topology = net.get("topology", "")
    directed = net.get("directed")
    if not net.get("file") and topology in DIRECTED_TOPOLOGIES:
        if directed is False:
            raise ValidationError(f"[network] topology = {topology!r} is directed: remove directed = false")
        return True
    if net.get("mixing") == PUSH_SUM and not directed:
        raise ValidationError("[network] mixing = \"push_sum\" (column stochastic) is for directed networks: add "
                              "directed = true (an undirected topology or file then sends both ways along each edge)")
    return bool(directed)


def build_directed(net: dict, run_seed: int, params: dict) -> DirectedNetwork:
    """The directed network of a ``[network]`` table (:func:`wants_directed`)."""
    mixing, lazy = net.get("mixing", PUSH_SUM), net.get("lazy", False)
    check_mixing(mixing, lazy)
    if net.get("sparse") is True:
        raise ValidationError("[network] sparse = true: directed networks are dense (at most "
                              f"{DENSE_MAX_N} agents)")
    if net.get("file"):
        return load_directed_file(net["file"], kind=net.get("file_kind", "auto"))
    seed = net.get("seed", 0)
    return DirectedNetwork.from_topology(net.get("topology", "erdos_renyi"), net.get("n", 10), mixing=mixing,
                                         seed=run_seed if seed == "run" else seed, **params)


__all__ = ["DIRECTED_TOPOLOGIES", "PUSH_SUM", "DirectedNetwork", "build_directed", "check_mixing",
           "directed_edges_of", "directed_erdos_renyi", "directed_ring", "is_directed", "load_directed_file",
           "push_sum_matrix", "require_strongly_connected", "unreachable", "validate_column_stochastic",
           "wants_directed"]
