"""Comm backends of the simulator: every row in one process.

* :class:`DenseComm`   — W as a dense matrix, ``mix`` = one BLAS product (fast for small or dense graphs).
* :class:`SparseComm`  — the edge list only, sums in the canonical order (bit-exact with a neighbour-exchange
                         backend; memory O(n + E), for large sparse graphs).
* :class:`StackedComm` — independent systems side by side on one row axis: replicas of a sweep (one W per
                         replica) or copies of one network (audits); ``mix`` = one batched product.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from privdl.comm.base import Comm, canonical_mix
from privdl.errors import ValidationError
from privdl.network.edges import Edges, adjacency
from privdl.network.network import Network


class _Cached:
    """A numpy matrix (or stack of matrices) as a tensor, converted once per (dtype, device)."""

    def __init__(self, m: np.ndarray) -> None:
        self.m = np.asarray(m, dtype=np.float64)
        self._cache: dict[tuple, torch.Tensor] = {}

    def get(self, like: torch.Tensor) -> torch.Tensor:
        key = (like.dtype, str(like.device))
        if key not in self._cache:
            self._cache[key] = torch.as_tensor(self.m, dtype=like.dtype, device=like.device)
        return self._cache[key]


def _heard(network: Network) -> np.ndarray:
    """The 0/1 matrix of ``neighbour_sum``: adjacency(W) (symmetric support), or on a directed network the senders
    each agent hears, W_ij ≠ 0 (i ≠ j)."""
    if not getattr(network, "directed", False):
        return adjacency(network.W)
    a = (np.asarray(network.W) != 0).astype(float)
    np.fill_diagonal(a, 0.0)
    return a


class DenseComm(Comm):
    """All n rows of one network; ``mix`` is W @ x (BLAS), the rest edge by edge in canonical order."""

    def __init__(self, network: Network) -> None:
        super().__init__(network.edges)
        self.network = network
        w = network.dense("a dense Comm ([network] sparse = false)")
        self._w, self._a = _Cached(w), _Cached(_heard(network))

    def _mix(self, x: torch.Tensor) -> torch.Tensor:
        return (self._w.get(x) @ x.reshape(self.rows, -1)).reshape(x.shape)

    def _neighbour_sum(self, x: torch.Tensor) -> torch.Tensor:
        return (self._a.get(x) @ x.reshape(self.rows, -1)).reshape(x.shape)


class SparseComm(Comm):
    """All n rows of one network from its edge list; every sum in canonical order."""

    def __init__(self, network: Network) -> None:
        super().__init__(network.edges)
        self.network = network

    def _mix(self, x: torch.Tensor) -> torch.Tensor:
        return canonical_mix(x, self.edges)


class StackedComm(Comm):
    """R independent systems of n rows each: row r·n + i is agent i of system r. Built from R networks (replicas of
    a sweep, each with its own W) or from one network and a number of copies (audits)."""

    def __init__(self, networks: Sequence[Network] | Network, copies: int | None = None) -> None:
        if isinstance(networks, Network):
            if copies is None or copies < 1:
                raise ValidationError("StackedComm of one network needs copies >= 1")
            nets, shared = [networks], True
            reps = int(copies)
        else:
            nets, shared = list(networks), False
            reps = len(nets)
            if not nets:
                raise ValidationError("StackedComm needs at least one network")
            if copies is not None:
                raise ValidationError("copies applies to a single network")
        n = nets[0].n
        if any(getattr(net, "dynamics", None) is not None for net in nets):
            raise ValidationError("networks with a time-varying graph ([network] dynamics) are not stacked: each "
                                  "replica's edges change with its own round law; run them one by one")
        if any(net.n != n for net in nets):
            raise ValidationError(f"stacked networks must have the same number of agents; got {[x.n for x in nets]}")
        edges = Edges.stack([nets[0].edges] * reps if shared else [net.edges for net in nets])
        super().__init__(edges, groups=reps)
        self.networks, self.shared = nets, shared  # self.n: Comm.n, the agents of one system
        #: sparse networks are mixed edge by edge in canonical order (no n×n matrix)
        self.edgewise = any(net.sparse for net in nets)
        if not self.edgewise:
            self._w = _Cached(nets[0].W if shared else np.stack([net.W for net in nets]))
            self._a = _Cached(_heard(nets[0]) if shared else np.stack([_heard(net) for net in nets]))

    @classmethod
    def copies(cls, network: Network, copies: int) -> "StackedComm":
        return cls(network, copies)

    def _product(self, m: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(self.groups, self.n, -1)
        out = torch.matmul(m, y) if m.ndim == 2 else torch.bmm(m, y)
        return out.reshape(x.shape)

    def _mix(self, x: torch.Tensor) -> torch.Tensor:
        return canonical_mix(x, self.edges) if self.edgewise else self._product(self._w.get(x), x)

    def _neighbour_sum(self, x: torch.Tensor) -> torch.Tensor:
        return super()._neighbour_sum(x) if self.edgewise else self._product(self._a.get(x), x)


def make_comm(network: Network, *, sparse: bool | None = None) -> Comm:
    """The simulator's Comm for ``network``: :class:`SparseComm` when ``sparse`` (default: n ≥ 200 and fewer than
    10% of the pairs are edges), else :class:`DenseComm`."""
    if getattr(network, "dynamics", None) is not None:  # a time-varying graph: W(t)'s edges, canonical sums
        return SparseComm(network).follow(network.dynamics)
    if sparse is None:
        density = (len(network.edges) + network.n) / network.n**2
        sparse = network.sparse or (network.n >= 200 and density < 0.1)
    return SparseComm(network) if sparse else DenseComm(network)


__all__ = ["DenseComm", "SparseComm", "StackedComm", "make_comm"]
