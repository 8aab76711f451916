"""The one way rows talk: a tagged communication object (DESIGN.md, "communication").

An algorithm sees a :class:`Comm` and nothing else of the network: it may read its own incoming edges
(``comm.edges``: sender, weight, reverse edge; ``comm.degree``), never W as a whole. Every transmission is a method
call with a ``tag`` and is reported to the attached observers as messages ``(t, tag, src, dst, payload)``:

* ``mix(x)``           every agent j broadcasts x_j; agent i computes Σ_j w_ij x_j (its own term included);
* ``neighbour_sum(x)`` the same broadcast; agent i computes Σ_{j ∈ N(i)} x_j (itself excluded);
* ``pull(x)``          edge e = (j → i) delivers x_j to i: an (E, ...) tensor, one value per incoming edge;
* ``push(v)``          per-edge values go back along the reverse edges: edge e = (j → i) delivers v[reverse(e)],
                       the value that j computed for its own incoming edge from i;
* ``send(v)``          edge e delivers v[e] (point to point; a per-edge encoding of what is sent);
* ``average(x)``       a trusted aggregator (``SERVER``, index −1 in transcripts) receives every x_i and returns the
                       mean of the agent's group (the centralized baseline; an all-reduce in a deployment);
* ``reduce(v, weight=)`` is local: per-edge values → per-row sums over the row's incoming edges (no message).

**Canonical summation order.** Sums over incoming edges run in the canonical edge order (by sender, increasing),
each term rounded before it is added, and ``mix`` starts from the own term w_ii·x_i. :class:`SparseComm`, ``reduce``
and every ``neighbour_sum`` of :class:`SparseComm` follow it exactly (a neighbour-exchange backend that adds in the
same order reproduces them bit for bit); :class:`DenseComm` and :class:`StackedComm` mix with a BLAS product, which
agrees to rounding.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from privdl.network.edges import Edges, SlotOrder

#: The trusted aggregator's index in transcripts of :meth:`Comm.average`.
SERVER = -1

#: How an algorithm combines what it receives (``Algorithm.combines``), as the mechanisms that depend on it read it
#: (``GradientMechanism.needs_combination``): ``"linear_mixing"`` — the agents talk only through :meth:`Comm.mix`
#: and every privatised gradient reaches their models only through it (a doubly stochastic W applied linearly to a
#: value the gradient is a term of: D-SGD's x ← W(x − η g̃)), so noise correlated across agents for W (DECOR, Whisper)
#: cancels in the mixing, and Zip-DL's and Muffliato's averaging can stand in for the mix; ``"other"`` — anything
#: else (a gradient added after the mix, neighbour sums, in-place averaging, values sent as they are).
LINEAR_MIXING = "linear_mixing"
COMBINATIONS = (LINEAR_MIXING, "other")
#: What an algorithm sends (``Algorithm.transmits``: message tag → one of these kinds):
#: ``model`` — the model after one step on one privatised gradient, before the mix (x − η g̃; D-SGD adapt then
#: combine); ``obfuscated_model`` — the same through seed 002's random matrix step-size or protection (DSG-RMS);
#: ``model_per_edge`` — a model with a different term on each edge (PD-LMS); ``exact_diffusion`` — exact
#: diffusion's φ = ψ + w − ψ_prev, and ``obfuscated_exact_diffusion`` (EDSG-RMS); ``tracking_model`` and
#: ``tracker`` — gradient tracking's θ − η y and y (DSGT), and their ``obfuscated_`` forms (DSGT-RMS); ``other`` —
#: anything else (cross-gradients, neighbour sums, a model before its gradient step, ...); ``push_sum_numerator``
#: and ``push_sum_weight`` — SGP's x − η g̃ (the numerator after one step on one privatised gradient) and its
#: data-independent push-sum weight w (directed networks, :mod:`privdl.algorithms.sgp`).
MESSAGE_KINDS = ("model", "obfuscated_model", "model_per_edge", "exact_diffusion", "obfuscated_exact_diffusion",
                 "tracking_model", "tracker", "obfuscated_tracking_model", "obfuscated_tracker", "other",
                 "push_sum_numerator", "push_sum_weight")
#: the tag SGP mixes its push-sum weight w under (kind ``push_sum_weight``): data-independent, so Zip-DL's noise
#: leaves it alone (:class:`privdl.mechanisms.zip_dl.PushSumZipDLComm`)
PUSH_SUM_WEIGHT_TAG = "w"


class Observer(Protocol):
    """Anything that watches the wire: an eavesdropper, a curious neighbour, a byte counter, a test."""

    def on_message(self, *, t: int, tag: str, src: torch.Tensor, dst: torch.Tensor,
                   payload: torch.Tensor) -> None: ...


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1)


class Comm(ABC):
    """Communication among ``rows`` agents (or replicas × agents) over ``edges``; ``groups`` independent systems of
    ``rows // groups`` rows each (``average`` is per group). ``t`` is the current round, set by the engine."""

    def __init__(self, edges: Edges, *, groups: int = 1) -> None:
        self.edges, self.rows, self.groups = edges, edges.rows, int(groups)
        self.t = 0
        self._observers: list[Observer] = []
        self.meter = None  # an AgentBytes (privdl.comm.observers): payload bytes per agent and tag, from shapes
        self._sweep: tuple | None = None  # average_in_place's per-agent edge lists, built once per edge set

    # ---- time-varying graphs: the round's edges (privdl.network.dynamics) -----------------------------------------
    #: the law of W(t) the edges follow (None: one W for the run); set by :meth:`follow`
    dynamics = None
    _device = None

    @property
    def t(self) -> int:
        """The current round (set by the engine); on a time-varying graph setting it switches to W(t)'s edges."""
        return self._t

    @t.setter
    def t(self, value: int) -> None:
        self._t = value
        if self.dynamics is not None:
            edges = self.dynamics.edges(int(value))
            if self._device is not None:  # each round's edges moved once (kept with their CPU original)
                entry = self._moved.get(id(edges))
                if entry is None or entry[0] is not edges:
                    if len(self._moved) > 64:
                        self._moved.clear()
                    entry = self._moved[id(edges)] = (edges, edges.to(self._device))
                edges = entry[1]
            if edges is not self.edges:
                self._set_edges(edges)

    def follow(self, dynamics) -> "Comm":
        """Mix with W(t) of ``dynamics`` (a :class:`privdl.network.dynamics.Dynamics`) in round t; returns self."""
        if self.groups != 1:
            raise ValueError("a stacked Comm does not follow a time-varying graph: run the replicas one by one")
        self.dynamics, self._moved = dynamics, {}
        self.t = self._t
        return self

    def _set_edges(self, edges: Edges) -> None:
        """Use ``edges`` from now on (a time-varying graph's round); backends that plan per edge set re-plan."""
        self.edges, self._sweep = edges, None

    # ---- observation ----------------------------------------------------------------------------------------------
    def attach(self, observer: Observer) -> Observer:
        """Report every later message to ``observer``; returns it."""
        self._observers.append(observer)
        return observer

    def detach(self, observer: Observer) -> None:
        self._observers.remove(observer)

    @property
    def observed(self) -> bool:
        return bool(self._observers)

    @contextmanager
    def silenced(self):
        """No observer sees the transmissions made inside (a resumed run re-running ``init`` for its state's
        structure: its observers were restored from the checkpoint)."""
        kept, self._observers, meter, self.meter = self._observers, [], self.meter, None
        try:
            yield self
        finally:
            self._observers, self.meter = kept, meter

    def _report(self, tag: str, src: torch.Tensor, dst: torch.Tensor, payload: Callable[[], torch.Tensor]) -> None:
        if not self._observers:
            return
        value = payload()
        for o in self._observers:
            o.on_message(t=self.t, tag=tag, src=src, dst=dst, payload=value)

    def _meter(self, tag: str, src: torch.Tensor, dst: torch.Tensor, like: torch.Tensor, *,
               cache: bool = True) -> None:
        """Count one call's messages (src[k] → dst[k], one row of ``like`` each) on the meter (``cache``: src and
        dst come back every call — the edges' tensors)."""
        if self.meter is not None:
            width = like.numel() // like.shape[0] * like.element_size() if like.shape[0] else 0
            self.meter.count(tag, src, dst, width, cache=cache)

    # ---- local facts ----------------------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        """The network's number of agents (one system's rows), whatever rows this engine holds."""
        return self.rows // self.groups

    @property
    def degree(self) -> torch.Tensor:
        """Number of neighbours of every row, (rows, 1) (for broadcasting against (rows, d))."""
        return self.edges.degree[:, None]

    def to(self, device: torch.device | str) -> "Comm":
        self.edges = self.edges.to(device)
        if self.dynamics is not None:
            self._device, self._moved = device, {}
        return self

    # ---- transmissions --------------------------------------------------------------------------------------------
    # Payload gathers index with x[idx]: torch's CPU index_select is ~14× slower on few, wide rows (d ≈ 10⁵).
    def mix(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        """Σ_j w_ij x_j for every row i (own term included)."""
        e = self.edges
        self._meter(tag, e.src, e.dst, x)
        self._report(tag, e.src, e.dst, lambda: x[e.src])
        return self._mix(x)

    def average_in_place(self, x: torch.Tensor, *, tag: str, offset: torch.Tensor | None = None) -> torch.Tensor:
        """The seed-004 authors' gossip: agent 0, then 1, …, each replaces its value by the plain average of its own
        and its neighbours' *current* values, so an agent reads the already-updated values of the neighbours before
        it (Gauss–Seidel). As a matrix it is (I − L)⁻¹(D + U) for the neighbour-average weights 1/(deg_i + 1) split
        into diagonal, strictly lower and upper parts: row stochastic, **not doubly stochastic, not synchronous**
        (the network average is not preserved). ``offset`` (rows, ...) is added to each agent's average as part of its
        own update, so the agents after it read the sum (seed 004's DSGT adds −η Σ_j w_ij y_j and the gradient change
        this way). Each system of a stacked Comm is swept in the same agent order; every neighbour's value is
        reported once, as read."""
        flat = _flat(x).clone()
        extra = None if offset is None else _flat(offset)
        e = self.edges
        self._meter(tag, e.src, e.dst, flat)  # every edge once, as the sweep sends them
        if self._sweep is None or self._sweep[0] is not e:
            n = self.rows // self.groups
            plan = []
            for k in range(n):  # agent k of every system: its incoming edges, its rows, their systems
                idx = torch.nonzero(e.dst % n == k).reshape(-1)
                plan.append((e.src[idx], e.dst[idx], torch.div(e.dst[idx], n, rounding_mode="floor").long(),
                             torch.arange(self.groups, device=e.dst.device) * n + k))
            self._sweep = (e, plan)
        share = 1.0 / (self.degree.to(flat.dtype) + 1.0)
        for src, dst, system, rows in self._sweep[1]:
            values = flat[src]
            self._report(tag, src, dst, lambda: values)
            total = flat[rows].index_add(0, system, values) * share[rows]
            flat[rows] = total if extra is None else total + extra[rows]
        return flat.reshape(x.shape)

    def neighbour_sum(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        """Σ_{j ∈ N(i)} x_j for every row i (neighbours only)."""
        e = self.edges
        self._meter(tag, e.src, e.dst, x)
        self._report(tag, e.src, e.dst, lambda: x[e.src])
        return self._neighbour_sum(x)

    def pull(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        """x_src(e) delivered to dst(e), for every incoming edge e: (E, ...)."""
        e = self.edges
        v = x[e.src]
        self._meter(tag, e.src, e.dst, x)
        self._report(tag, e.src, e.dst, lambda: v)
        return v

    def push(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        """Per-edge values sent back along the reverse edges: out[e] = per_edge[reverse(e)] (from src(e) to dst(e))."""
        e = self.edges
        v = per_edge[e.reverse]
        self._meter(tag, e.src, e.dst, per_edge)
        self._report(tag, e.src, e.dst, lambda: v)
        return v

    def send(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        """Edge e delivers per_edge[e] from src(e) to dst(e) (a per-edge encoding of what a sender transmits)."""
        if per_edge.shape[0] != len(self.edges):
            raise ValueError(f"send needs one value per edge ({len(self.edges)}), got {per_edge.shape[0]}")
        e = self.edges
        self._meter(tag, e.src, e.dst, per_edge)
        self._report(tag, e.src, e.dst, lambda: per_edge)
        return per_edge

    def average(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        """Every row receives the mean of its group's rows, through a trusted aggregator (``SERVER``)."""
        rows = torch.arange(self.rows, device=x.device)
        server = torch.full_like(rows, SERVER)
        self._meter(tag, rows, server, x, cache=False)
        self._report(tag, rows, server, lambda: x)
        per = self.rows // self.groups
        mean = x.reshape(self.groups, per, *x.shape[1:]).mean(dim=1, keepdim=True)
        out = mean.expand(self.groups, per, *x.shape[1:]).reshape(x.shape).clone()
        self._meter(tag, server, rows, x, cache=False)
        self._report(tag, server, rows, lambda: out)
        return out

    # ---- local computation ----------------------------------------------------------------------------------------
    def reduce(self, per_edge: torch.Tensor, *, weight: torch.Tensor | str | None = None) -> torch.Tensor:
        """Σ_{e: dst(e) = i} weight_e · per_edge[e] for every row i, in canonical order (no message). ``weight`` is
        an (E,) tensor, ``"mixing"`` for the edges' own mixing weights w_ij, or None."""
        w = self.edges.weight if isinstance(weight, str) and weight == "mixing" else weight
        if isinstance(weight, str) and weight != "mixing":
            raise ValueError(f"weight must be a tensor, 'mixing' or None, got {weight!r}")
        flat = _flat(per_edge)
        out = torch.zeros(self.rows, flat.shape[1], dtype=flat.dtype, device=flat.device)
        return _slot_sum(out, self.edges, flat, w).reshape(self.rows, *per_edge.shape[1:])

    # ---- backends -------------------------------------------------------------------------------------------------
    @abstractmethod
    def _mix(self, x: torch.Tensor) -> torch.Tensor: ...

    def _neighbour_sum(self, x: torch.Tensor) -> torch.Tensor:
        return canonical_neighbour_sum(x, self.edges)

    def describe(self) -> dict[str, object]:
        return {"comm": type(self).__name__, "rows": self.rows, "edges": len(self.edges), "groups": self.groups}


#: elements (rows × columns) of the terms :func:`_slot_sum` gathers at once, beyond one slot's worth (out's size)
SLOT_CHUNK = 1 << 16


def _slot_sum(out: torch.Tensor, edges: Edges, values: torch.Tensor, weight: torch.Tensor | None, *,
              by_sender: bool = False, rows: torch.Tensor | None = None,
              position: torch.Tensor | None = None, order: SlotOrder | None = None,
              gathered: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
    """out_i + Σ over row i's incoming edges e of weight_e · v_e, slot by slot (canonical order): v_e = values[e]
    for per-edge values (E, d), or values[src(e)] with ``by_sender`` for per-row values (rows, d). ``rows``: only
    these rows (``out`` has one row per entry), the senders' rows read from ``values[position[src(e)]]`` — each
    row's sum is the same operations on the same numbers, so the same bits as the whole network's.

    The terms weight_e · v_e are gathered in slot order (:class:`privdl.network.edges.SlotOrder`: each rounded once,
    a few slots' worth at a time, at most max(out's size, :data:`SLOT_CHUNK`) numbers). With ragged degrees the rows
    are first put in the order's ``perm`` (by degree, decreasing), where the rows that fill slot k are a prefix: slot
    k adds its terms to that prefix in one ``+=``, and the rows go back to their places at the end (a gather: the
    sums are returned, ``out`` is only added to in place when every row fills every slot). A row past its degree
    adds nothing, so a graph with ragged degrees costs its edges, not (largest degree) passes over every row, and
    each row's sum is exactly out_i + t_1 + t_2 + … in canonical order (a plain per-row loop's bits). ``order``:
    ``rows``' slot order, when the caller planned it once (:class:`privdl.comm.sliced.SliceComm`, per edge set);
    ``gathered``: the terms' rows of ``values`` and weights in that order, as :class:`RowsPlan` keeps them."""
    if order is None:
        order = edges.slot_order if rows is None else SlotOrder.of(edges.slots[:, rows])
    if not order.counts:
        return out
    if gathered is not None:
        at, w = gathered
    else:
        at, w = _terms(edges, order, weight, values.dtype, values.device, by_sender=by_sender, position=position)
    acc = out if order.perm is None else out.index_select(0, order.perm)
    width = max(1, values[0].numel()) if values.shape[0] else 1
    budget = max(out.shape[0], SLOT_CHUNK // width)
    counts, k, start = order.counts, 0, 0
    while k < len(counts):
        end, size = k + 1, counts[k]  # a group of slots: at least one, at most `budget` terms
        while end < len(counts) and size + counts[end] <= budget:
            size, end = size + counts[end], end + 1
        term = values.index_select(0, at[start:start + size])
        if w is not None:
            term.mul_(w[start:start + size, None])
        off = 0
        for c in counts[k:end]:
            acc[:c].add_(term[off:off + c])  # (not ``acc[:c] +=``: its __setitem__ copies the sum onto itself)
            off += c
        start, k = start + size, end
    return acc if order.perm is None else acc.index_select(0, order.place)


def _terms(edges: Edges, order: SlotOrder, weight: torch.Tensor | None, dtype: torch.dtype, device, *,
           by_sender: bool, position: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_slot_sum`'s terms in slot order: the rows of its values they read, and their weights (or None)."""
    at = edges.src.index_select(0, order.edge) if by_sender else order.edge
    if position is not None:
        at = position.index_select(0, at)
    return at, None if weight is None else weight.to(dtype=dtype, device=device).index_select(0, order.edge)


@dataclass(frozen=True)
class RowsPlan:
    """What :func:`canonical_rows` gathers for one set of rows, edges, table layout, dtype and device — the same
    every round of a static graph: made once (:meth:`of`) and passed back, it saves a round of a small model the
    index arithmetic (the sums are the same operations on the same numbers: the same bits)."""

    order: SlotOrder
    own: torch.Tensor  # the rows' own places in the table
    self_weight: torch.Tensor | None  # (len(rows), 1): w_ii in the values' dtype (a mix), None (a neighbour sum)
    at: torch.Tensor  # the table rows of the terms, in slot order
    weight: torch.Tensor | None  # the terms' weights in the values' dtype, in slot order (None: a neighbour sum)
    #: a mix's own rows (in the order's ``perm``) then its terms: their table rows and weights, (rows + terms, 1) —
    #: one gather and one product for the whole sum when it is small (:func:`canonical_rows`); None: a neighbour sum
    fused_at: torch.Tensor | None = None
    fused_weight: torch.Tensor | None = None
    fused_split: tuple[int, ...] = ()  # the rows', then each slot's, number of entries of fused_at

    @classmethod
    def of(cls, edges: Edges, rows: torch.Tensor, position: torch.Tensor, *, weighted: bool, dtype: torch.dtype,
           device, order: SlotOrder | None = None) -> "RowsPlan":
        order = SlotOrder.of(edges.slots[:, rows]) if order is None else order
        at, w = _terms(edges, order, edges.weight if weighted else None, dtype, device, by_sender=True,
                       position=position)
        sw = edges.self_weight.to(dtype=dtype, device=device)[rows][:, None] if weighted else None
        own = position[rows]
        if not weighted:
            return cls(order, own, sw, at, w)
        first, first_w = (own, sw) if order.perm is None else (own[order.perm], sw[order.perm])
        return cls(order, own, sw, at, w, torch.cat([first, at]), torch.cat([first_w, w[:, None]]),
                   (int(own.shape[0]), *order.counts))


def canonical_mix(x: torch.Tensor, edges: Edges) -> torch.Tensor:
    """w_ii x_i, then + w_ij x_j for each incoming edge in canonical order (every term rounded, then added)."""
    flat = _flat(x)
    out = edges.self_weight.to(dtype=flat.dtype, device=flat.device)[:, None] * flat
    return _slot_sum(out, edges, flat, edges.weight, by_sender=True).reshape(x.shape)


def canonical_rows(table: torch.Tensor, edges: Edges, rows: torch.Tensor, position: torch.Tensor, *,
                   weighted: bool, order: SlotOrder | None = None, plan: RowsPlan | None = None) -> torch.Tensor:
    """Rows ``rows`` of :func:`canonical_mix` (``weighted``) or :func:`canonical_neighbour_sum`, bit for bit, from a
    table holding only the rows they read (row j of the network at ``table[position[j]]``): (len(rows), d).
    ``order``: ``SlotOrder.of(edges.slots[:, rows])``, if the caller keeps it (else made here); ``plan``: all of
    its gathers, made once by the caller (:meth:`RowsPlan.of`, of these arguments and ``table``'s dtype and
    device)."""
    if plan is None:
        plan = RowsPlan.of(edges, rows, position, weighted=weighted, dtype=table.dtype, device=table.device,
                           order=order)
    width = table.numel() // table.shape[0] if table.shape[0] else 1
    if plan.fused_at is not None and plan.fused_at.numel() * width <= SLOT_CHUNK:
        # a small mix: every product w·x (the own terms, in the order's perm, then the terms slot by slot) from one
        # gather and one multiplication — each rounded as _slot_sum rounds it —, then the slots added to the own
        # terms in canonical order: the same additions of the same numbers, so the same bits, in fewer calls
        term = table.index_select(0, plan.fused_at)
        term.mul_(plan.fused_weight)
        o = plan.order
        m = plan.own.shape[0]
        acc, *slots = term.split_with_sizes(plan.fused_split)  # (one call for every slot's view)
        for c, part in zip(o.counts, slots):
            (acc if c == m else acc[:c]).add_(part)
        return acc if o.perm is None else acc.index_select(0, o.place)
    if weighted:
        out = table.index_select(0, plan.own)
        out.mul_(plan.self_weight)
    else:
        out = table.new_zeros((len(rows), *table.shape[1:]))
    return _slot_sum(out, edges, table, None, rows=rows, order=plan.order, gathered=(plan.at, plan.weight))


def canonical_neighbour_sum(x: torch.Tensor, edges: Edges) -> torch.Tensor:
    """Σ_{j ∈ N(i)} x_j in canonical order."""
    flat = _flat(x)
    return _slot_sum(torch.zeros_like(flat), edges, flat, None, by_sender=True).reshape(x.shape)


__all__ = ["COMBINATIONS", "Comm", "LINEAR_MIXING", "MESSAGE_KINDS", "Observer", "RowsPlan", "SERVER", "canonical_mix",
           "canonical_neighbour_sum", "canonical_rows"]
