"""Graph topologies (SPEC §1). Every generator returns an undirected ``networkx.Graph`` on nodes 0..n-1.

Random topologies are drawn from a seeded RNG and conditioned on connectivity by resampling, with an error after a
bounded number of tries.
"""

from __future__ import annotations

import math
from typing import Callable

import networkx as nx
import numpy as np

from privdl.errors import ValidationError
from privdl.network.edges import graph_arrays
from privdl.network.sparse import _check_connect, _check_n, bridge
from privdl.registry import Registry

TOPOLOGIES: Registry[Callable[..., nx.Graph]] = Registry("topology")

MAX_TRIES = 200


def _connected(draw: Callable[[int], nx.Graph], seed: int, what: str) -> nx.Graph:
    """Resample ``draw(seed_k)`` until the graph is connected."""
    rng = np.random.default_rng(seed)
    for _ in range(MAX_TRIES):
        g = draw(int(rng.integers(2**31 - 1)))
        if nx.is_connected(g):
            return g if set(g) == set(range(g.number_of_nodes())) else nx.convert_node_labels_to_integers(
                g, ordering="sorted")
    raise ValidationError(
        f"{what} was disconnected in all {MAX_TRIES} draws; increase its density parameter"
    )


@TOPOLOGIES.register("erdos_renyi")
def erdos_renyi(n: int, *, p: float, seed: int = 0, connect: str = "resample") -> nx.Graph:
    """Erdős–Rényi G(n, p) conditioned on being connected (``connect = "resample"``), or one draw whose small
    components are each joined to the largest by one edge (``"bridge"``; see :mod:`privdl.network.sparse`)."""
    _check_n(n)
    if not 0.0 < p <= 1.0:
        raise ValidationError(f"erdos_renyi edge probability p must be in (0, 1], got {p!r}")
    _check_connect(connect)
    if p == 1.0:
        return nx.complete_graph(n)
    if connect == "bridge":
        rng = np.random.default_rng(seed)
        _, i, j = graph_arrays(nx.gnp_random_graph(n, p, seed=int(rng.integers(2**31 - 1))))
        i, j = bridge(n, i, j, rng)
        g = nx.empty_graph(n)
        g.add_edges_from(zip(i.tolist(), j.tolist()))
        return g
    return _connected(lambda s: nx.gnp_random_graph(n, p, seed=s), seed, f"erdos_renyi(n={n}, p={p})")


@TOPOLOGIES.register("ring")
def ring(n: int, *, seed: int = 0) -> nx.Graph:
    _check_n(n, 3)
    return nx.cycle_graph(n)


@TOPOLOGIES.register("star")
def star(n: int, *, seed: int = 0) -> nx.Graph:
    _check_n(n, 2)
    return nx.star_graph(n - 1)


@TOPOLOGIES.register("path")
def path(n: int, *, seed: int = 0) -> nx.Graph:
    _check_n(n, 2)
    return nx.path_graph(n)


@TOPOLOGIES.register("complete")
def complete(n: int, *, seed: int = 0) -> nx.Graph:
    _check_n(n)
    return nx.complete_graph(n)


def _grid_shape(n: int, rows: int | None) -> tuple[int, int]:
    if rows is None:
        rows = int(math.isqrt(n))
        while n % rows:
            rows -= 1
    if rows < 1 or n % rows:
        raise ValidationError(f"grid rows={rows} does not divide n={n}")
    return rows, n // rows


@TOPOLOGIES.register("grid")
def grid(n: int, *, rows: int | None = None, seed: int = 0) -> nx.Graph:
    """2-D grid of rows × (n / rows) agents (rows defaults to the most square factorisation)."""
    _check_n(n, 2)
    r, c = _grid_shape(n, rows)
    return nx.convert_node_labels_to_integers(nx.grid_2d_graph(r, c), ordering="sorted")


@TOPOLOGIES.register("torus")
def torus(n: int, *, rows: int | None = None, seed: int = 0) -> nx.Graph:
    """2-D torus (periodic grid) of rows × (n / rows) agents."""
    _check_n(n, 4)
    r, c = _grid_shape(n, rows)
    return nx.convert_node_labels_to_integers(
        nx.grid_2d_graph(r, c, periodic=True), ordering="sorted"
    )


@TOPOLOGIES.register("random_regular")
def random_regular(n: int, *, degree: int = 3, seed: int = 0) -> nx.Graph:
    _check_n(n, 2)
    if degree < 1 or degree >= n or (n * degree) % 2:
        raise ValidationError(f"random_regular needs 1 <= degree < n and n*degree even; got n={n}, degree={degree}")
    return _connected(lambda s: nx.random_regular_graph(degree, n, seed=s), seed, f"random_regular(n={n}, degree={degree})")


@TOPOLOGIES.register("random_geometric")
def random_geometric(n: int, *, radius: float = 0.4, seed: int = 0) -> nx.Graph:
    _check_n(n)
    if radius <= 0:
        raise ValidationError(f"random_geometric radius must be > 0, got {radius!r}")
    return _connected(lambda s: nx.random_geometric_graph(n, radius, seed=s), seed, f"random_geometric(n={n}, radius={radius})")


@TOPOLOGIES.register("small_world")
def small_world(n: int, *, k: int = 4, rewire: float = 0.1, seed: int = 0) -> nx.Graph:
    """Watts–Strogatz small world: ring lattice with k nearest neighbours, edges rewired with probability ``rewire``."""
    _check_n(n, 3)
    if not 2 <= k < n:
        raise ValidationError(f"small_world needs 2 <= k < n, got k={k}, n={n}")
    if not 0.0 <= rewire <= 1.0:
        raise ValidationError(f"small_world rewiring probability must be in [0, 1], got {rewire}")
    return _connected(lambda s: nx.watts_strogatz_graph(n, k, rewire, seed=s), seed, f"small_world(n={n}, k={k})")


@TOPOLOGIES.register("exponential")
def exponential(n: int, *, seed: int = 0) -> nx.Graph:
    """Static exponential graph: agent i is linked to i ± 2^k (mod n) for 2^k < n (undirected)."""
    _check_n(n, 2)
    g = nx.empty_graph(n)
    hop = 1
    while hop < n:
        g.add_edges_from((i, (i + hop) % n) for i in range(n) if (i + hop) % n != i)
        hop *= 2
    return g


def make_graph(name: str, n: int, *, seed: int = 0, **params: object) -> nx.Graph:
    """Build the registered topology ``name`` with ``n`` agents."""
    return TOPOLOGIES.build(name, n, seed=seed, **params)
