"""The graph's edges, Laplacian and fingerprint — each built in exactly one place (every other module calls these).

The **canonical edge order** is the order in which privdl stores and sums incoming edges: by receiver (dst), then
by sender (src), both increasing. :class:`Edges` holds every directed edge j → i (i ≠ j) of an undirected graph in
that order, with its mixing weight w_ij, so that a receiver's sum Σ_j w_ij x_j is taken in a fixed, documented order
(see :mod:`privdl.comm`).
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from functools import cached_property

import networkx as nx
import numpy as np
import scipy.sparse as sps
import torch


def adjacency(w_or_graph: np.ndarray | nx.Graph) -> np.ndarray:
    """The 0/1 adjacency matrix (float64, zero diagonal) of a graph, or of a mixing matrix's support (W_ij ≠ 0 or
    W_ji ≠ 0, i ≠ j)."""
    if isinstance(w_or_graph, nx.Graph):
        a = _graph_adjacency(w_or_graph)
    else:
        w = np.asarray(w_or_graph)
        a = ((w != 0) | (w.T != 0)).astype(float)
    np.fill_diagonal(a, 0.0)
    return a


def graph_arrays(graph: nx.Graph) -> tuple[int, np.ndarray, np.ndarray]:
    """(n, i, j): the undirected edges (i, j) of a graph on integer nodes, as two int64 arrays."""
    n = graph.number_of_nodes()
    e = np.fromiter(itertools.chain.from_iterable(graph.edges()), dtype=np.int64,
                    count=2 * graph.number_of_edges()).reshape(-1, 2)
    return n, e[:, 0], e[:, 1]


def _graph_adjacency(graph: nx.Graph) -> np.ndarray:
    """Adjacency of a graph on nodes 0..n-1, filled from its edge list (networkx's ``to_numpy_array`` walks a dict
    per node and is ~10× slower on the n = 1000–2000 graphs of the covariance figures)."""
    n = graph.number_of_nodes()
    try:
        nodes = np.fromiter(graph.nodes, dtype=np.int64, count=n)
        _, i, j = graph_arrays(graph)
    except (TypeError, ValueError):
        nodes = None
    if nodes is None or not np.array_equal(np.sort(nodes), np.arange(n)):
        return (nx.to_numpy_array(graph, nodelist=range(n), weight=None, dtype=float) != 0).astype(float)
    a = np.zeros((n, n))
    a[i, j] = 1.0
    a[j, i] = 1.0
    return a


def laplacian(w_or_graph: np.ndarray | nx.Graph) -> np.ndarray:
    """The unweighted graph Laplacian D − A (of a graph, or of a mixing matrix's support)."""
    a = adjacency(w_or_graph)
    return np.diag(a.sum(axis=1)) - a


def directed_edges(w_or_graph: np.ndarray | nx.Graph) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of every directed edge j → i, i ≠ j, in the canonical order (dst, then src, increasing)."""
    dst, src = np.nonzero(adjacency(w_or_graph))  # row-major: sorted by dst, then src
    return src.astype(np.int64), dst.astype(np.int64)


def undirected_edges(w_or_graph: np.ndarray | nx.Graph) -> list[tuple[int, int]]:
    """The undirected edges (i, j), i < j, sorted."""
    src, dst = directed_edges(w_or_graph)
    keep = src < dst
    return list(zip(src[keep].tolist(), dst[keep].tolist()))


def fingerprint(w: np.ndarray) -> str:
    """SHA-256 (first 16 hex digits) of W rounded to 12 decimals: identifies W in manifests and caches. A sparse
    (CSR) W hashes its shape, structure and rounded values, prefixed by ``csr``."""
    if sps.issparse(w):
        c = sps.csr_array(w, dtype=np.float64)
        c.sort_indices()
        h = hashlib.sha256(b"csr" + repr(c.shape).encode())
        for part in (c.indptr.astype("<i8"), c.indices.astype("<i8"), np.round(c.data, 12).astype("<f8")):
            h.update(part.tobytes())
        return h.hexdigest()[:16]
    w = np.asarray(w, dtype=np.float64)
    payload = repr(w.shape).encode() + np.round(w, 12).astype("<f8").tobytes()
    return hashlib.sha256(payload).hexdigest()[:16]


def _reverse(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """reverse[e]: the index of edge dst(e) → src(e), for edges in canonical order of a symmetric support. Edge ids
    laid out as a CSR matrix (row dst, column src) and transposed (scipy's linear-time CSR↔CSC conversion, which
    keeps columns sorted) land, in the same canonical layout, on the ids of the reverse edges — no argsort of 10⁷
    keys, and 2 index arrays of extra memory instead of 6."""
    index = src.dtype
    indptr = np.zeros(n + 1, dtype=index)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    ids = sps.csr_array((np.arange(len(src), dtype=index), src, indptr), shape=(n, n))
    t = ids.T.tocsr()
    if not (np.array_equal(t.indptr, indptr) and np.array_equal(t.indices, src)):
        raise ValueError("edges do not have a symmetric support: some edge has no reverse")
    return t.data


def index_dtype(count: int) -> type:
    """The integer type of edge and agent indices: int32 while every index fits (half the memory of int64 at 10⁷
    edges; torch indexes with it directly), else int64."""
    return np.int32 if count < np.iinfo(np.int32).max else np.int64


@dataclass(frozen=True)
class SlotOrder:
    """A set of rows' incoming edges listed slot by slot, for sums that touch only the rows filling a slot. The rows
    are taken in ``perm`` order — by degree, decreasing (ties by row, increasing), so the rows that fill slot k are
    the first ``counts[k]`` of ``perm`` — and ``edge`` lists slot 0 of those rows, then slot 1, ... (the edge ids);
    ``perm`` is None when every row fills every slot (a regular graph: rows in their own order). Summing slot by slot
    over it adds each row's terms in canonical order; a graph with ragged degrees costs its edges, not (largest
    degree) × rows."""

    edge: torch.Tensor
    counts: tuple[int, ...]
    perm: torch.Tensor | None
    #: each row's place in ``perm`` (its inverse; None with it)
    place: torch.Tensor | None = None

    @classmethod
    def of(cls, slots: torch.Tensor) -> "SlotOrder":
        """From a (K, rows) slot table (−1 past a row's degree)."""
        filled = slots >= 0
        counts = tuple(filled.sum(dim=1).tolist())
        if all(c == slots.shape[1] for c in counts):
            return cls(slots.reshape(-1), counts, None)
        perm = torch.sort(filled.sum(dim=0), descending=True, stable=True).indices
        table = slots.index_select(1, perm)
        place = torch.empty_like(perm)
        place[perm] = torch.arange(len(perm), device=perm.device)
        return cls(table[table >= 0], counts, perm, place)


@dataclass(frozen=True)
class Edges:
    """The incoming edges of a set of rows, in canonical order: edge e carries a message from ``src[e]`` to
    ``dst[e]`` with mixing weight ``weight[e]`` = w_{dst,src}; ``reverse[e]`` is the index of the edge dst → src.
    ``rows`` is the number of rows (agents) the indices refer to; ``self_weight`` (rows,) holds w_ii. Indices are
    int32 while they fit (:func:`index_dtype`)."""

    src: torch.Tensor
    dst: torch.Tensor
    weight: torch.Tensor
    reverse: torch.Tensor
    self_weight: torch.Tensor
    rows: int

    @classmethod
    def from_matrix(cls, w: np.ndarray) -> "Edges":
        """Edges of a mixing matrix's support (symmetric: every edge has its reverse). A sparse (CSR) W is read
        from its structure: CSR rows are receivers and columns senders, so its order is the canonical one."""
        if sps.issparse(w):
            c = sps.csr_array(w, dtype=np.float64)
            c.sort_indices()
            n = c.shape[0]
            rows = np.repeat(np.arange(n, dtype=c.indices.dtype), np.diff(c.indptr))
            off = rows != c.indices
            dst, src, weight = rows[off], c.indices[off], c.data[off]
            del rows, off
            selfw = c.diagonal()
        else:
            w = np.asarray(w, dtype=np.float64)
            n = w.shape[0]
            src, dst = directed_edges(w)
            weight, selfw = w[dst, src], np.diag(w).copy()
        index = index_dtype(max(n, len(src)))
        src, dst = src.astype(index, copy=False), dst.astype(index, copy=False)
        return cls(torch.as_tensor(src), torch.as_tensor(dst), torch.as_tensor(weight),
                   torch.as_tensor(_reverse(n, src, dst)), torch.as_tensor(selfw), n)

    @classmethod
    def stack(cls, parts: list["Edges"]) -> "Edges":
        """The edges of independent blocks of rows side by side (block b's rows offset by the rows before it)."""
        src, dst, weight, reverse, selfw = [], [], [], [], []
        rows = edges = 0
        index = getattr(torch, np.dtype(index_dtype(sum(p.rows + len(p) for p in parts))).name)
        for p in parts:
            src.append(p.src.to(index) + rows)
            dst.append(p.dst.to(index) + rows)
            weight.append(p.weight)
            reverse.append(p.reverse.to(index) + edges)
            selfw.append(p.self_weight)
            rows += p.rows
            edges += len(p.src)
        return cls(torch.cat(src), torch.cat(dst), torch.cat(weight), torch.cat(reverse), torch.cat(selfw), rows)

    def __len__(self) -> int:
        return int(self.src.numel())

    @cached_property
    def degree(self) -> torch.Tensor:
        """Number of incoming edges of every row (its neighbours, itself excluded), (rows,) int64."""
        return torch.bincount(self.dst, minlength=self.rows)

    @cached_property
    def slots(self) -> torch.Tensor:
        """(K, rows) edge indices: slot k of row i is its k-th incoming edge in canonical order, or −1 past its degree
        (K = the largest degree). Summing slot by slot adds each row's terms in canonical order."""
        deg = self.degree
        k = int(deg.max()) if self.rows and len(self) else 0
        start = torch.cumsum(deg, 0) - deg
        dev = self.src.device
        slot = torch.full((k, self.rows), -1, dtype=self.src.dtype, device=dev)
        if len(self):
            pos = torch.arange(len(self), device=dev) - start[self.dst]
            slot[pos, self.dst] = torch.arange(len(self), dtype=self.src.dtype, device=dev)
        return slot

    @cached_property
    def slot_order(self) -> SlotOrder:
        """The edges slot by slot (:class:`SlotOrder`): what :func:`privdl.comm.base._slot_sum` runs over."""
        return SlotOrder.of(self.slots)

    def to(self, device: torch.device | str) -> "Edges":
        return Edges(self.src.to(device), self.dst.to(device), self.weight.to(device), self.reverse.to(device),
                     self.self_weight.to(device), self.rows)


__all__ = ["Edges", "SlotOrder", "adjacency", "directed_edges", "fingerprint", "graph_arrays", "index_dtype",
           "laplacian", "undirected_edges"]
