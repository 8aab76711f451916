"""Time-varying graphs: the law of W(t) (``[network] dynamics``; issue 46 item 1).

A run on a time-varying graph mixes with a different symmetric doubly stochastic W(t) each round t (round 0 is the
algorithm's ``init``). W(t) is a *public* draw: every process computes it alone from the run's root seed
(the key ``public("network/dynamics")`` of :class:`privdl.keys.RootKeys`, folded with t, seeds a
``numpy`` PCG64 generator — the same numbers on every CPU and backend), so no message is needed to agree on it,
and a process knows from it which neighbours it exchanges with in round t. Laws (``dynamics``):

* ``static`` — W(t) = W, the ``[network]`` graph's (the default; no law is recorded).
* ``random_matching`` — a uniformly random matching of the n agents each round (a random permutation, paired
  consecutively; one agent idles when n is odd); matched pairs average: w_ij = 1/2 (the Metropolis–Hastings weights
  of a matching). The ``[network]`` topology is not used.
* ``one_peer_exponential`` — agent i averages with i XOR 2^m, m = t mod ⌈log₂ n⌉, w = 1/2 (an agent whose partner
  would be ≥ n idles that round). This is the **symmetric** one-peer exponential graph (the hypercube's dimension
  exchange). Ying et al. 2021 ("Exponential graph is provably efficient for decentralized deep training") define a
  *directed* one-peer graph, i → i + 2^m mod n with weights 1/2; both share the property checked in the tests: with
  n a power of 2, any log₂ n consecutive rounds of plain averaging give the exact average (the product of the
  W(t) is 11ᵀ/n).
* ``peer_sampling`` — each agent draws ``peers`` = k distinct out-peers uniformly among the others every round;
  the round's graph is the union of those edges made undirected (symmetrised), weighted by Metropolis–Hastings.
  Its rounds are drawn up to :data:`BLOCK` at a time (rounds b·B … from one generator seeded by the key folded with
  a constant, then with b; all numpy, no loop over agents, no sparse matrix): still a function of the root seed
  and the round only.
* ``cycle`` — W(t) = W_{t mod L} for the graphs of ``graphs = [file, …]`` (edge lists, adjacency matrices or W
  itself, read like ``network.file``; relative paths against the config's folder), weighted by ``mixing``. One graph
  of the cycle may be disconnected; their union must be connected.

Every W(t) is validated when it is made (:func:`check_round`): non-negative, symmetric, rows (hence columns)
summing to 1 (``peer_sampling``: a block of rounds in one pass, a failure named by its round). The manifest
records the law (:meth:`Dynamics.law`), not the matrices.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import networkx as nx
import numpy as np
import scipy.sparse as sps
import torch

from privdl.errors import ValidationError
from privdl.keys import RootKeys, fold_int
from privdl.network.edges import Edges, SlotOrder, fingerprint, index_dtype

#: the laws of W(t) ``[network] dynamics`` names
DYNAMICS = ("static", "random_matching", "one_peer_exponential", "peer_sampling", "cycle")
#: laws whose weights are their own (matching: 1/2; peer sampling: Metropolis–Hastings on the round's graph)
NATURAL = ("random_matching", "one_peer_exponential", "peer_sampling")
#: purpose of the public key W(t) is drawn from
PURPOSE = "network/dynamics"
#: the requirement (``Algorithm.requires``) of an algorithm that needs one W for the whole run: "fixed_mixing: why"
FIXED_MIXING = "fixed_mixing"


#: ``peer_sampling`` draws up to this many rounds at once: rounds b·B … b·B + B − 1 from one generator (the key
#: folded with BLOCK_KEY, then with b) in one numpy pass — the draw is a function of the seed, the law's n and k
#: and the round only. B = BLOCK while B·n·k ≤ BLOCK_DRAWS (a block's arrays stay a few MB), fewer for large n·k.
BLOCK = 16
BLOCK_DRAWS = 1 << 17
BLOCK_KEY = 0x70656572  # "peer"


#: the requirement of an algorithm that needs every agent to have a neighbour in every round: "...: why"
NEIGHBOUR_EVERY_ROUND = "neighbour_every_round"


def fixed_mixing_reason(requires: Sequence[str], what: str = FIXED_MIXING) -> str | None:
    """The reason an algorithm needs a fixed W (its ``requires`` entry ``"fixed_mixing: <reason>"``; ``what``:
    another requirement of that form), or None."""
    for r in requires:
        if r.split(":", 1)[0].strip() == what:
            return r.split(":", 1)[1].strip() if ":" in r else "its analysis uses one W for the whole run"
    return None


def mh_edges(n: int, i: np.ndarray, j: np.ndarray, *, lazy: bool = False, slots: bool = True) -> Edges:
    """The :class:`Edges` of the Metropolis–Hastings W on the undirected edges (i, j) of ``n`` agents (duplicates
    and self-loops dropped; agents in no edge keep w_ii = 1), in canonical order.

    Built in numpy with no sparse matrix and no loop over agents (it runs once per round of a random law): the
    pairs lo < hi are packed as int64 keys lo·n + hi, sorted and deduplicated, the degrees are bincounts, and each
    pair's two directed edges are placed in canonical order (receiver, then sender) by counting: receiver v's
    senders below v are the pairs (·, v) in order of lo, then those above v are the pairs (v, ·) in order of hi
    (already sorted). Each edge's reverse is its twin's place. ``slots=False``: no slot table (a block of rounds
    that :func:`split_rounds` splits gets each round's slot order there)."""
    i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    keep = lo != hi
    pairs = lo * n + hi if keep.all() else lo[keep] * n + hi[keep]
    if n * n <= np.iinfo(np.int32).max:  # (the same keys, sorted and split faster in 32 bits)
        pairs = pairs.astype(np.int32)
    pairs.sort()
    if len(pairs) > 1:
        pairs = pairs[np.concatenate([[True], pairs[1:] != pairs[:-1]])]
    lo = pairs // n
    hi = pairs - lo * n
    m = len(pairs)
    below, above = np.bincount(hi, minlength=n), np.bincount(lo, minlength=n)  # senders below / above each agent
    deg = below + above
    start = np.cumsum(deg) - deg  # first edge of each receiver
    # edge lo ← hi (receiver lo): after lo's `below` senders, in the (sorted) order of hi
    slot_a = below[lo] + (np.arange(m) - (np.cumsum(above) - above)[lo])
    # edge hi ← lo (receiver hi): the pairs by (hi, lo) — a stable sort of hi (pairs are sorted by lo already)
    by_hi = np.argsort(hi.astype(np.int16) if n <= np.iinfo(np.int16).max else hi, kind="stable")
    slot_b = np.empty(m, dtype=np.int64)
    slot_b[by_hi] = np.arange(m) - (np.cumsum(below) - below)[hi[by_hi]]
    pos_a, pos_b = start[lo] + slot_a, start[hi] + slot_b
    index = index_dtype(max(n, 2 * m))
    # receivers are sorted: dst is each agent repeated deg times; the senders and reverses are placed, and each
    # edge's weight read off the degrees at its two ends (the same 1 / (1 + max) as its pair's)
    dst = np.repeat(np.arange(n, dtype=index), deg)
    src, reverse = np.empty(2 * m, dtype=index), np.empty(2 * m, dtype=index)
    src[pos_a], src[pos_b] = hi, lo
    reverse[pos_a], reverse[pos_b] = pos_b, pos_a
    weight = 1.0 / (1.0 + np.maximum(deg[src], deg[dst]))
    selfw = 1.0 - np.bincount(dst, weights=weight, minlength=n)  # (summed in canonical order)
    if lazy:
        weight, selfw = 0.5 * weight, 0.5 * (1.0 + selfw)
    if not slots:
        return _assemble(src, dst, weight, reverse, selfw, deg, None)
    table = np.full((int(deg.max()) if m else 0, n), -1, dtype=index)
    table[slot_a, lo] = pos_a
    table[slot_b, hi] = pos_b
    return _assemble(src, dst, weight, reverse, selfw, deg, table)


def _assemble(src: np.ndarray, dst: np.ndarray, weight: np.ndarray, reverse: np.ndarray, selfw: np.ndarray,
              deg: np.ndarray, slots: np.ndarray | None, order: SlotOrder | None = None) -> Edges:
    """An :class:`Edges` from canonical numpy arrays, with its degrees and slot table or slot order (cached
    properties) set."""
    e = Edges(torch.from_numpy(src), torch.from_numpy(dst), torch.from_numpy(weight), torch.from_numpy(reverse),
              torch.from_numpy(selfw), len(selfw))
    e.__dict__["degree"] = torch.from_numpy(deg)  # (Edges' cached properties, computed here in numpy)
    if slots is not None:
        e.__dict__["slots"] = torch.from_numpy(slots)
    if order is not None:
        e.__dict__["slot_order"] = order
    return e


def split_rounds(block: Edges, n: int) -> list[Edges]:
    """The Edges of ``block`` (B independent rounds side by side: round r's agents are rows r·n … r·n + n − 1, no
    edge between rounds) as B Edges of n rows each. In canonical order a round's edges are one contiguous range,
    so each round's arrays are slices, shifted to its own numbering. Each round's :class:`SlotOrder` (what the
    canonical sums run over) is made here for the whole block in a few numpy passes, by counting: a round's rows by
    degree, decreasing (a stable sort of small keys), and edge e of slot k at receiver v goes to place
    (edges of the round's slots before k) + (v's rank in that order) — the rows filling slot k are the first ones.
    No slot table is built (``Edges.slots`` makes one if asked)."""
    rounds = block.rows // n
    src, dst, rev = block.src.numpy(), block.dst.numpy(), block.reverse.numpy()
    weight, selfw, deg = block.weight.numpy(), block.self_weight.numpy(), block.degree.numpy()
    start = np.concatenate([[0], np.cumsum(deg)])
    slot = np.arange(len(src)) - start[dst]  # each edge's slot in its receiver's row
    top = int(deg.max()) if len(src) else 0
    which = np.repeat(np.arange(rounds), n)  # each row's round
    key = which * (top + 1) + (top - deg)  # (round, degree decreasing); row order kept by the stable sort
    perm = np.argsort(key.astype(np.int16) if rounds * (top + 1) <= np.iinfo(np.int16).max else key, kind="stable")
    rank = np.empty(len(deg), dtype=np.int64)
    rank[perm] = np.tile(np.arange(n), rounds)
    hist = np.bincount(which * (top + 1) + deg, minlength=rounds * (top + 1)).reshape(rounds, top + 1)
    counts = hist[:, ::-1].cumsum(axis=1)[:, ::-1][:, 1:]  # counts[r, k]: rows of round r with degree > k
    first = np.cumsum(counts, axis=1) - counts  # where slot k starts in round r's slot order
    placed = np.empty(len(src), dtype=src.dtype)
    edge_round = which[dst]
    first_edge = start[edge_round * n]  # each edge's round's first edge
    placed[first_edge + first[edge_round, slot] + rank[dst]] = np.arange(len(src)) - first_edge
    # every round in its own numbering at once (rows less r·n, edges less the round's first edge): slices below
    shift = (edge_round * n).astype(src.dtype, copy=False)
    src_l, dst_l, rev_l = src - shift, dst - shift, rev - first_edge.astype(src.dtype, copy=False)
    perm_l = perm - which * n  # (perm lists round 0's rows, then round 1's, ...)
    top_r = deg.reshape(rounds, n).max(axis=1).tolist()
    out = []
    for r in range(rounds):
        a, z = int(start[r * n]), int(start[(r + 1) * n])
        index = index_dtype(max(n, z - a))
        c = tuple(counts[r, :top_r[r] if z > a else 0].tolist())
        ragged = not all(x == n for x in c)
        order = SlotOrder(torch.from_numpy(placed[a:z].astype(index, copy=False)), c,
                          torch.from_numpy(perm_l[r * n:(r + 1) * n]) if ragged else None,
                          torch.from_numpy(rank[r * n:(r + 1) * n]) if ragged else None)
        out.append(_assemble(src_l[a:z].astype(index, copy=False), dst_l[a:z].astype(index, copy=False),
                             weight[a:z], rev_l[a:z].astype(index, copy=False), selfw[r * n:(r + 1) * n],
                             deg[r * n:(r + 1) * n], None, order))
    return out


def matching_edges(partner: np.ndarray, *, lazy: bool = False) -> Edges:
    """The :class:`Edges` of a matching's W (w = 1/2 between partners; ``partner[i]`` = −1: i idles, w_ii = 1):
    one incoming edge per matched agent, so the canonical order is the matched agents' order."""
    partner = np.asarray(partner, dtype=np.int64)
    n = len(partner)
    dst = np.flatnonzero(partner >= 0)
    src = partner[dst]
    rank = np.full(n, -1, dtype=np.int64)
    rank[dst] = np.arange(len(dst))
    half = np.full(len(dst), 0.5)
    selfw = np.where(partner >= 0, 0.5, 1.0)
    if lazy:
        half, selfw = 0.5 * half, 0.5 * (1.0 + selfw)
    index = index_dtype(n)
    e = Edges(torch.from_numpy(src.astype(index)), torch.from_numpy(dst.astype(index)), torch.from_numpy(half),
              torch.from_numpy(rank[src].astype(index)), torch.from_numpy(selfw), n)
    e.__dict__["degree"] = torch.from_numpy((partner >= 0).astype(np.int64))
    e.__dict__["slots"] = torch.from_numpy(rank.astype(index)[None, :] if len(dst) else np.zeros((0, n), index))
    return e


def sample_peers(rng: np.random.Generator, n: int, k: int, rounds: int = 1) -> np.ndarray:
    """(n, k): for every agent i, k distinct peers drawn uniformly among the n − 1 others (every k-subset equally
    likely), all agents at once: Floyd's algorithm run on the n rows together (a loop over the k columns, none over
    agents; no rejection). Column c draws u uniform in {0, …, N − k + c} (N = n − 1), keeps it if the row has not
    chosen it yet, else takes N − k + c; the numbers 0..N−1 then skip the agent itself. ``rounds`` > 1: that many
    rounds at once, (rounds·n, k), row r·n + i for agent i in round r."""
    big = n - 1
    u = rng.integers(0, np.arange(big - k + 1, big + 1), size=(rounds * n, k))  # column c: 0 <= u < N − k + c + 1
    out = np.empty((rounds * n, k), dtype=np.int64)
    for c in range(k):
        seen = (out[:, :c] == u[:, c:c + 1]).any(axis=1)
        out[:, c] = np.where(seen, big - k + c, u[:, c])
    return out + (out >= np.tile(np.arange(n), rounds)[:, None])


def check_round(edges: Edges, t: int, law: str, *, tol: float = 1e-9) -> None:
    """Refuse a W(t) that is not symmetric doubly stochastic with non-negative entries, naming the round and the
    offending value."""
    w, s = edges.weight.numpy(), edges.self_weight.numpy()
    where = f"W({t}) of dynamics {law!r}"
    if len(w) and w.min() < 0 or s.min() < -tol:
        raise ValidationError(f"{where} has a negative entry (min off-diagonal {w.min() if len(w) else 0:g}, "
                              f"min diagonal {s.min():g})")
    rows = s + np.bincount(edges.dst.numpy(), weights=w, minlength=edges.rows)
    bad = np.flatnonzero(np.abs(rows - 1.0) > tol)
    if len(bad):
        raise ValidationError(f"{where}: row {int(bad[0])} sums to {rows[bad[0]]:.12g}, not 1")
    src, dst, rev = edges.src.numpy(), edges.dst.numpy(), edges.reverse.numpy()
    if len(rev) and (rev.min() < 0 or rev.max() >= len(rev)
                     or not (np.array_equal(src[rev], dst) and np.array_equal(dst[rev], src))):
        raise ValidationError(f"{where}: the reverse of some edge is not the edge back (every edge needs its "
                              "reverse, none twice)")
    asym = np.flatnonzero(np.abs(w - w[rev]) > tol)
    if len(asym):
        e = int(asym[0])
        raise ValidationError(f"{where} is not symmetric: w[{int(edges.dst[e])},{int(edges.src[e])}] = {w[e]:g}")


def read_graph(path: str | Path, *, n: int | None, mixing: str, lazy: bool) -> tuple[int, Edges]:
    """One graph of a ``cycle``: (its number of agents, the Edges of its W under ``mixing``). A square 0/1 matrix
    with zero diagonal is an adjacency matrix, two integer columns an edge list (agents 0..n−1, n the largest + 1,
    or ``n``), any other square matrix W itself. The graph need not be connected."""
    from privdl.data.files import read_matrix
    from privdl.network.mixing import mixing_matrix

    path = Path(path)
    arr = read_matrix(path, "cycle graph file")
    if arr.ndim != 2:
        raise ValidationError(f"cycle graph file {path}: a graph file holds a matrix or an edge list")
    square = arr.shape[0] == arr.shape[1]
    if square and np.isin(arr, (0.0, 1.0)).all() and not arr.diagonal().any():
        g = nx.from_numpy_array(arr)
    elif arr.shape[1] == 2 and np.all(arr == np.round(arr)) and arr.min() >= 0:
        m = int(arr.max()) + 1 if n is None else int(n)
        if arr.size and arr.max() >= m:
            raise ValidationError(f"cycle graph file {path} names agent {int(arr.max())}; [network] n = {m}")
        g = nx.empty_graph(m)
        g.add_edges_from((int(a), int(b)) for a, b in arr if a != b)
    elif square:
        edges = Edges.from_matrix(arr)
        check_round(edges, 0, f"cycle: W from {path.name}")
        return arr.shape[0], edges
    else:
        raise ValidationError(f"cycle graph file {path} holds a {arr.shape[0]}×{arr.shape[1]} table: an edge list "
                              "has two integer columns, a matrix is square")
    try:
        w = mixing_matrix(g, mixing, lazy_=lazy)
    except ValidationError as exc:
        raise ValidationError(f"cycle graph file {path}: {exc}") from None
    return g.number_of_nodes(), Edges.from_matrix(w)


class Dynamics:
    """The law of W(t) for a run of ``n`` agents: ``edges(t)`` gives round t's edges and weights (cached: a
    periodic law keeps its period's W, a random one the last few rounds'), each checked by :func:`check_round`."""

    def __init__(self, name: str, n: int, *, seed: int = 0, mixing: str = "metropolis_hastings",
                 lazy: bool = False, peers: int | None = None, graphs: Sequence[str | Path] = (),
                 description: Sequence[str] | None = None) -> None:
        if name not in DYNAMICS or name == "static":
            raise ValidationError(f"unknown dynamics {name!r}; valid: {', '.join(DYNAMICS)}")
        self.name, self.n, self.lazy, self.mixing = name, int(n), bool(lazy), mixing
        if name in NATURAL and mixing != "metropolis_hastings":
            raise ValidationError(
                f"dynamics {name!r} weighs each round's graph itself ("
                + ("w = 1/2 on the matched pairs: the Metropolis–Hastings weights of a matching"
                   if name != "peer_sampling" else "Metropolis–Hastings on the round's graph")
                + f"); mixing = {mixing!r} cannot be used with it: allowed mixing = \"metropolis_hastings\" "
                "(lazy = true for (I + W(t))/2)")
        if name == "peer_sampling":
            if peers is None:
                raise ValidationError("dynamics \"peer_sampling\" needs [network] peers = k (out-peers per round)")
            if isinstance(peers, bool) or not isinstance(peers, (int, np.integer)) or not 1 <= peers < self.n:
                raise ValidationError(f"[network] peers = {peers!r}: each agent draws k distinct peers among the "
                                      f"other {self.n - 1}, so 1 <= peers <= {self.n - 1} (n = {self.n})")
        elif peers is not None:
            raise ValidationError(f"[network] peers = {peers!r} applies to dynamics \"peer_sampling\" only, "
                                  f"not {name!r}")
        self.peers = None if peers is None else int(peers)
        #: rounds of peer_sampling drawn together (:data:`BLOCK`, fewer when n·k is large)
        self.block = None if peers is None else max(1, min(BLOCK, BLOCK_DRAWS // (self.n * self.peers)))
        if name == "cycle":
            if not graphs:
                raise ValidationError("dynamics \"cycle\" needs [network] graphs = [\"a.csv\", ...] (at least one)")
            read = [read_graph(g, n=None, mixing=mixing, lazy=lazy) for g in graphs]
            sizes = [m for m, _ in read]
            if len(set(sizes)) > 1:
                named = ", ".join(f"{Path(g).name}: n = {m}" for g, m in zip(graphs, sizes))
                raise ValidationError(f"the graphs of a cycle must have one number of agents; got {named}")
            self.n = sizes[0]
            self._cycle = [e for _, e in read]
            union = nx.empty_graph(self.n)
            for e in self._cycle:
                union.add_edges_from(zip(e.src.tolist(), e.dst.tolist()))
            if not nx.is_connected(union):
                raise ValidationError("the union of the cycle's graphs is disconnected: some agents never reach "
                                      "the others, so no average is reached")
            self.graphs = [str(Path(g).name) for g in (description or graphs)]
        elif graphs:
            raise ValidationError(f"[network] graphs applies to dynamics \"cycle\" only, not {name!r}")
        else:
            self.graphs = []
        if self.n < 2:
            raise ValidationError(f"a time-varying graph needs at least 2 agents, got n = {self.n}")
        self.seed = int(seed)
        self.key = RootKeys(self.seed).public(PURPOSE)
        self._periodic: dict[int, Edges] = {}
        self._recent: dict[int, Edges] = {}
        self._blocks: dict[int, list[Edges]] = {}

    # ---- the law --------------------------------------------------------------------------------------------
    @property
    def period(self) -> int | None:
        """The number of distinct W(t) of a periodic law (W(t) = W(t mod period)), None for a random one."""
        if self.name == "cycle":
            return len(self._cycle)
        if self.name == "one_peer_exponential":
            return max(1, math.ceil(math.log2(self.n)))
        return None

    def law(self) -> dict:
        """What the manifest records: the law's name and parameters (not the matrices)."""
        out: dict = {"dynamics": self.name, "n": self.n, "mixing": self.mixing, "lazy": self.lazy,
                     "key": f"public({PURPOSE!r}) of the run's root seed, folded with t"}
        if self.peers is not None:
            out["peers"] = self.peers
            out["block"] = self.block
            out["key"] = (f"public({PURPOSE!r}) of the run's root seed, folded with {BLOCK_KEY:#x} then with "
                          f"t // {self.block} (rounds drawn {self.block} at a time)")
        if self.name == "cycle":
            out["graphs"] = self.graphs
            out["fingerprints"] = [self.fingerprint(t) for t in range(len(self._cycle))]
        if self.period is not None:
            out["period"] = self.period
        return out

    def possible_pairs(self) -> set[tuple[int, int]]:
        """Every pair (a < b) some W(t) may join: the union of a period's edges for a periodic law, every pair for a
        random one (a matching or a peer draw can join any two agents). Agreed keys are agreed for these pairs
        (:func:`privdl.agreement.needed_pairs`): a pairwise draw on round t's edges must find its key."""
        if self.period is None:
            return {(a, b) for a in range(self.n) for b in range(a + 1, self.n)}
        out: set[tuple[int, int]] = set()
        for k in range(self.period):
            e = self.edges(k)
            out |= {(min(a, b), max(a, b)) for a, b in zip(e.src.tolist(), e.dst.tolist()) if a != b}
        return out

    def edges(self, t: int) -> Edges:
        """Round t's edges with their weights w_ij(t) (checked)."""
        p = self.period  # (slices of a sliced run are threads: each reads and fills the caches atomically)
        if p is not None:
            k = t % p
            e = self._periodic.get(k)
            if e is None:
                e = self._cycle[k] if self.name == "cycle" else self._make(k)
                check_round(e, t, self.name)
                self._periodic[k] = e
            return e
        e = self._recent.get(t)
        if e is None:
            e = self._make(t)
            if self.name != "peer_sampling":  # (its rounds are checked a block at a time: _peer_round)
                check_round(e, t, self.name)
            if len(self._recent) >= 8:  # the last few rounds (slices may be a round apart)
                self._recent.clear()
            self._recent[t] = e
        return e

    def matrix(self, t: int) -> sps.csr_array:
        """W(t) as a sparse matrix."""
        e = self.edges(t)
        m = sps.csr_array((e.weight.numpy(), (e.dst.long().numpy(), e.src.long().numpy())), shape=(self.n, self.n))
        return (m + sps.diags_array(e.self_weight.numpy(), format="csr")).tocsr()

    def fingerprint(self, t: int) -> str:
        return fingerprint(self.matrix(t))

    def rng(self, t: int) -> np.random.Generator:
        """Round t's public generator (PCG64 seeded by the dynamics key folded with t)."""
        return np.random.default_rng(fold_int(self.key, int(t)))

    def _make(self, t: int) -> Edges:
        n = self.n
        if self.name == "one_peer_exponential":
            j = np.arange(n) ^ (1 << t)
            return matching_edges(np.where(j < n, j, -1), lazy=self.lazy)
        if self.name == "peer_sampling":
            return self._peer_round(t)
        rng = self.rng(t)
        if self.name == "random_matching":
            perm = rng.permutation(n)
            a, b = perm[0:n - 1:2], perm[1:n:2]
            partner = np.full(n, -1, dtype=np.int64)
            partner[a], partner[b] = b, a
            return matching_edges(partner, lazy=self.lazy)
        raise AssertionError(self.name)

    def _peer_round(self, t: int) -> Edges:
        """Round t of ``peer_sampling``: drawn with its block of ``self.block`` rounds (each agent's k out-peers by
        :func:`sample_peers`, the block's rounds as one graph of block·n rows made Metropolis–Hastings by
        :func:`mh_edges`, checked in one pass, then split per round), the last two blocks kept."""
        size = self.block
        b = t // size
        block = self._blocks.get(b)
        if block is None:
            n, k = self.n, self.peers
            rng = np.random.default_rng(fold_int(fold_int(self.key, BLOCK_KEY), b))
            peers = sample_peers(rng, n, k, rounds=size).reshape(size, n * k)
            peers += (np.arange(size) * n)[:, None]  # agent i of round r is row r·n + i
            whole = mh_edges(size * n, np.repeat(np.arange(size * n), k), peers.reshape(-1), lazy=self.lazy,
                             slots=False)
            block = split_rounds(whole, n)
            self._check_block(whole, block, b * size)
            if len(self._blocks) >= 2:
                self._blocks.clear()
            self._blocks[b] = block  # (one assignment: another slice reads a whole block or builds its own)
        return block[t % size]

    def _check_block(self, whole: Edges, rounds: list[Edges], first: int) -> None:
        """:func:`check_round` on a block of rounds at once: the block's W is the rounds' W side by side, so it is
        non-negative, symmetric and stochastic exactly when each round's is, provided no edge joins two rounds
        (checked here). One pass over the block instead of one per round (the per-call cost dominates at
        n = 1000); on a failure each round is checked alone to name the round."""
        try:
            check_round(whole, first, self.name)
            if not np.array_equal(whole.src.numpy() // self.n, whole.dst.numpy() // self.n):
                raise ValidationError(f"W({first}…) of dynamics {self.name!r}: an edge joins two rounds")
        except ValidationError:
            for r, e in enumerate(rounds):
                check_round(e, first + r, self.name)
            raise

    def lonely(self) -> str | None:
        """Why some agent has no neighbour in some round (None when every agent has one in every round)."""
        if self.name == "random_matching" and self.n % 2:
            return f"a matching of an odd number of agents (n = {self.n}) leaves one agent alone every round"
        if self.name == "one_peer_exponential" and self.n & (self.n - 1):
            return (f"with n = {self.n}, not a power of 2, an agent whose partner i XOR 2^m is ≥ n idles that "
                    "round")
        if self.name == "cycle":
            for k, e in enumerate(self._cycle):
                if bool((e.degree == 0).any()):
                    return (f"agent {int((e.degree == 0).nonzero()[0])} has no neighbour in the cycle's graph "
                            f"{self.graphs[k]}")
        return None

    def accesses(self, algorithm, iterations: int) -> torch.Tensor:
        """The noisy accesses per data owner ``algorithm`` makes in ``iterations`` rounds of this law: its count
        on round 0's edges, plus each round's increment on that round's edges (an algorithm whose count depends on
        the degree — cross-gradients — accesses deg_i(t) times in round t)."""
        if not getattr(algorithm, "cross", False):
            return algorithm.accesses(iterations, self.edges(0))
        total = algorithm.accesses(0, self.edges(0)).clone()
        for t in range(1, iterations + 1):
            e = self.edges(t)
            total += algorithm.accesses(1, e) - algorithm.accesses(0, e)
        return total

    def __repr__(self) -> str:
        return f"Dynamics({self.law()})"


#: why a mechanism cannot run on a time-varying graph (its design or its ledger rests on one W), by name
FIXED_W_MECHANISMS = {
    "zip_dl": "its pairwise network-DP ledger is computed from one W (each agent's worst neighbour's weight) and "
              "its zero-sum noise from one edge set",
    "muffliato": "its pairwise network-DP ledger is computed from one W (the gossip's spread S_uv = Σ_t W^t) and its "
                 "averaging from one edge set",
}


def whisper_refusal(dynamics: "Dynamics") -> str | None:
    """Why Whisper cannot run on ``dynamics`` (None: it can). A periodic law (``cycle``, ``one_peer_exponential``)
    has few distinct W(t): R is designed once for each (cached by the matrix's fingerprint). A random law draws a
    different W(t) almost every round, so no design can be made ahead of the run."""
    if dynamics.period is not None:
        return None
    return (f"Whisper designs R for each distinct W(t) ahead of the run, and {dynamics.name!r} draws a different "
            "W(t) almost every round (random_matching: n!/(2^(n/2)(n/2)!) perfect matchings; peer_sampling: more), "
            "so no design per W(t) can be made ahead of the run (periodic laws — cycle, one_peer_exponential — "
            "get one design per distinct W(t))")


def check_mechanism(mechanism, dynamics: "Dynamics", name: str | None = None) -> None:
    """Refuse a mechanism whose design or ledger needs one W, naming why (``mechanism``: the object, or its
    registered class before it is built, then with its ``name``)."""
    name = name or getattr(mechanism, "name", type(mechanism).__name__)
    why = FIXED_W_MECHANISMS.get(name)
    if name == "decor":  # any law: the canceling terms of round t on W(t)'s edges (privdl.mechanisms.decor)
        if isinstance(mechanism, type) or getattr(mechanism, "dynamics_", None) is dynamics:
            return
        why = "this DECOR mechanism's canceling terms were drawn on another network's edges, not this law's W(t)"
    elif name == "whisper":
        why = whisper_refusal(dynamics)
        if why is None and not isinstance(mechanism, type) and getattr(mechanism, "dynamics_", None) is not dynamics:
            why = "this whisper mechanism's R was designed for another network, not for this law's W(t)"
        if why is None:  # a periodic law: one design per distinct W(t) (privdl.mechanisms.whisper.WhisperNoise)
            return
    if why is None and getattr(mechanism, "needs_combination", None) is not None:
        why = getattr(mechanism, "dynamic_reason", None)
        if why is None and not getattr(mechanism, "follows_dynamics", False):
            why = "its noise covariance R is designed for one W (the noise cancels in W's mixing)"
    if why is not None:
        raise ValidationError(f"mechanism {name!r} cannot run on a time-varying graph ([network] dynamics = "
                              f"{dynamics.name!r}): {why}; use dynamics = \"static\", or ldp / dp_sgd / none")


__all__ = ["DYNAMICS", "Dynamics", "FIXED_MIXING", "FIXED_W_MECHANISMS", "NEIGHBOUR_EVERY_ROUND", "check_mechanism",
           "check_round", "fixed_mixing_reason", "matching_edges", "mh_edges", "read_graph", "sample_peers",
           "split_rounds", "whisper_refusal"]
