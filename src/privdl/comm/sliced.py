"""A Comm for an engine that holds only some agents (a slice), in the network frame.

Each slice computes in the network frame (:mod:`privdl.placement`): row i is agent i, but only the held agents'
rows are real. Before a combination, :class:`SliceComm` sends the rows (or per-edge values) its held agents
transmit to the slices that hold their receivers, receives those its held agents are sent, and then runs the
simulator's own canonical combination (:func:`privdl.comm.base.canonical_mix`) on the completed tensor — the same
kernel on the same shape, so a held agent's result equals the simulator's bit for bit. Rows of agents the slice
does not hold come out as zeros. What crosses between slices goes through a transport
(:mod:`privdl.comm.transport`); observers see it through the :class:`~privdl.comm.wire.Wire`; the held frame's Comm,
with one row per held agent, is :class:`privdl.comm.held.HeldComm`.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from privdl.comm.base import (SERVER, Comm, Observer, RowsPlan, _flat, canonical_mix, canonical_neighbour_sum,
                              canonical_rows)
from privdl.comm.transport import Transport
from privdl.comm.wire import Wire
from privdl.errors import PrivdlError
from privdl.network.edges import SlotOrder
from privdl.network.network import Network
from privdl.placement import Placement


class SliceComm(Comm):
    """The Comm of slice ``part``, which holds ``placement``'s agents of ``network``; ``owner[i]`` is the slice
    that holds agent i. Same methods, same canonical sums as :class:`privdl.comm.SparseComm`."""

    SMALL = 1 << 16  # numbers up to which mix / neighbour_sum combine the whole frame (fewer, larger calls)

    def __init__(self, network: Network, placement: Placement, part: int, owner: np.ndarray, transport: Transport,
                 wire: Wire | None = None) -> None:
        super().__init__(network.edges)
        if placement.replicas != 1:
            raise PrivdlError("a sliced run holds one system; stacked replicas are run one by one")
        self.network, self.placement, self.part = network, placement, int(part)
        self.owner = np.asarray(owner, dtype=np.int64)
        self.transport, self.wire = transport, wire
        self.seq = 0  # messages exchanged, the same count in every slice
        self.reports = 0  # report points passed, the same count in every slice
        self._plan(self.edges)
        if getattr(network, "dynamics", None) is not None:
            self.follow(network.dynamics)

    def _set_edges(self, edges) -> None:
        super()._set_edges(edges)
        self._plan(edges)
        if getattr(self, "_index_device", None) is not None:  # a re-plan (a time-varying graph's round) on a GPU
            self._move_index(self._index_device)

    def _plan(self, e) -> None:
        """Who sends what to whom over edges ``e`` (once, or each round of a time-varying graph: every slice
        computes the same W(t) from the public key, so the plans agree without a message)."""
        placement = self.placement
        src, dst = e.src.long().cpu().numpy(), e.dst.long().cpu().numpy()
        so, do = self.owner[src], self.owner[dst]
        me = self.part
        self.peers = [p for p in range(self.transport.parts) if p != me]
        # rows each peer needs from me (my agents that send to its agents) and rows I need from it, increasing
        self.rows_out = {p: torch.from_numpy(np.unique(src[(so == me) & (do == p)])) for p in self.peers}
        self.rows_in = {p: torch.from_numpy(np.unique(src[(so == p) & (do == me)])) for p in self.peers}
        # edges from me to a peer, and from a peer to me, in canonical order
        self.edges_out = {p: torch.from_numpy(np.flatnonzero((so == me) & (do == p))) for p in self.peers}
        self.edges_in = {p: torch.from_numpy(np.flatnonzero((so == p) & (do == me))) for p in self.peers}
        self.mine_in = torch.from_numpy(np.flatnonzero(do == me))  # edges my agents receive
        self.edge_mask = torch.from_numpy(do == me)
        self.row_mask = placement.row_mask
        # the rows my agents read (theirs and their neighbours' held elsewhere) and each one's place in that table
        read = np.union1d(np.asarray(placement.agents, dtype=np.int64),
                          np.concatenate([r.numpy() for r in self.rows_in.values()] + [np.zeros(0, np.int64)]))
        self.read_rows = torch.from_numpy(read)
        self.position = torch.full((self.rows,), -1, dtype=torch.long)
        self.position[self.read_rows] = torch.arange(len(read))
        held = placement.held_rows
        self.own_position = self.position[held]  # my rows' places in that table, and each peer's rows'
        self.in_position = {p: self.position[r] for p, r in self.rows_in.items()}
        # the same table laid out as its parts arrive — my rows, then each peer's (peers in order, those that send
        # any) — which one torch.cat builds (:meth:`_held_rows_sum` without a wire)
        self.cat_peers = tuple(p for p, r in self.rows_in.items() if r.numel())
        self.cat_position = torch.full((self.rows,), -1, dtype=torch.long)
        self.cat_position[held] = torch.arange(held.numel())
        at = held.numel()
        for p in self.cat_peers:
            r = self.rows_in[p]
            self.cat_position[r] = torch.arange(at, at + r.numel())
            at += r.numel()
        self.held_order = SlotOrder.of(e.slots[:, held])  # my rows' canonical sums (canonical_rows)
        self._on_device: dict = {}  # per plan: those index tensors on a device (_indices), the sums' RowsPlans

    def _indices(self, device: torch.device) -> tuple:
        """(own_position, in_position, held_rows, position) on ``device``, moved once per plan and device (each
        round's ``.to`` calls are a measurable part of a round of a small model)."""
        got = self._on_device.get(device)
        if got is None:
            got = self._on_device[device] = (self.own_position.to(device),
                                         {p: v.to(device) for p, v in self.in_position.items()},
                                         self.placement.held_rows.to(device), self.position.to(device))
        return got

    #: the plan's index tensors (:meth:`to` moves them with the edges)
    INDEX = ("rows_out", "rows_in", "edges_out", "edges_in", "mine_in", "edge_mask", "read_rows", "position",
             "own_position", "in_position", "cat_position")

    def to(self, device: torch.device | str) -> "SliceComm":
        """The edges (:meth:`Comm.to`) and the plan's index tensors on ``device`` (a process of the distributed
        runtime on a GPU: the kernels index the rows there); a re-plan keeps them there."""
        super().to(device)
        self._index_device = torch.device(device)
        self._move_index(self._index_device)
        return self

    def _move_index(self, device: torch.device) -> None:
        for name in self.INDEX:
            value = getattr(self, name)
            setattr(self, name, {p: v.to(device) for p, v in value.items()} if isinstance(value, dict)
                    else value.to(device))
        o = self.held_order
        self.held_order = type(o)(o.edge.to(device), o.counts, None if o.perm is None else o.perm.to(device),
                                  None if o.place is None else o.place.to(device))

    # ---- observation: parts merged by the wire --------------------------------------------------------------------
    def attach(self, observer: Observer) -> Observer:
        raise PrivdlError("observe a sliced run through its Wire (simulate_sliced(observers=...)), not one slice")

    @property
    def observed(self) -> bool:
        return self.wire is not None

    @contextmanager
    def silenced(self):
        kept, self.wire, meter, self.meter = self.wire, None, self.meter, None
        try:
            yield self
        finally:
            self.wire, self.meter = kept, meter

    def _part(self, tag: str, order: torch.Tensor | None, src=None, dst=None, payload=None) -> None:
        if self.wire is None:
            return
        seq = self.reports
        self.reports += 1
        entry = None if order is None else (order, src, dst, payload)
        self.wire.report(seq, self.t, tag, entry)

    def _edge_part(self, tag: str, per_edge: torch.Tensor) -> None:
        """Report the messages my agents receive: entries = my incoming edges, payload per edge."""
        if self.wire is None:
            return
        idx = self.mine_in
        e = self.edges
        self._part(tag, idx, e.src[idx], e.dst[idx], per_edge[idx])

    # ---- exchange -------------------------------------------------------------------------------------------------
    def _header(self, tag: str, value: torch.Tensor) -> tuple:
        return (self.t, tag, self.seq, str(value.dtype), tuple(value.shape))

    def _exchange(self, tag: str, out: dict[int, torch.Tensor], expect: dict[int, tuple[int, ...]],
                  like: torch.Tensor) -> dict[int, torch.Tensor]:
        """Post every peer's payload (peers in increasing order), then receive from every peer whose ``expect``
        (shape) is non-empty; one sequence number per call."""
        t, seq = self.t, self.seq
        sends = [(p, (t, tag, seq, str(value.dtype), tuple(value.shape)), value) for p, value in out.items()
                 if value.shape[0]]
        dtype = str(like.dtype)
        recvs = [(p, (t, tag, seq, dtype, shape)) for p, shape in expect.items() if shape[0]]
        return self._send_receive(sends, recvs, like)

    def _send_receive(self, sends: list, recvs: list, like: torch.Tensor) -> dict[int, torch.Tensor]:
        """One call's messages through the transport (``sends``: (receiver, header, payload), ``recvs``: (sender,
        header), headers of this call's round and sequence number, which this counts): the payloads received, by
        sender, on ``like``'s device."""
        got = self.transport.exchange(self.part, sends, recvs)
        self.seq += 1
        if like.is_cpu:  # (the common case, checked without making a device object per payload)
            for p, v in got.items():
                if not v.is_cpu:
                    got[p] = v.cpu()
            return got
        dev = like.device
        return {p: v if v.device == dev else v.to(dev) for p, v in got.items()}

    def _rows_in(self, flat: torch.Tensor, tag: str) -> dict[int, torch.Tensor]:
        """Send each peer the rows of my agents that its agents read; the rows my agents read, by peer."""
        out = {p: flat.index_select(0, r) for p, r in self.rows_out.items()}
        expect = {p: (int(r.numel()), *flat.shape[1:]) for p, r in self.rows_in.items()}
        return self._exchange(tag, out, expect, flat)

    def _complete_rows(self, x: torch.Tensor, tag: str) -> torch.Tensor:
        """``x`` with the rows of my agents' neighbours held elsewhere filled in from their slices."""
        flat = _flat(x)
        got = self._rows_in(flat, tag)
        if not got:
            return x
        full = flat.clone()
        for p, value in got.items():
            full[self.rows_in[p]] = value
        return full.reshape(x.shape)

    def _held_sum(self, x: torch.Tensor, tag: str, *, weighted: bool) -> torch.Tensor:
        """mix (``weighted``) or neighbour_sum for my agents only, from the rows they read (the canonical kernels on
        those rows: the simulator's bits), zeros elsewhere — nothing of size n·d is combined. Small tensors (at most
        ``SMALL`` numbers) take the whole-frame kernel instead: the same bits, fewer calls."""
        flat = _flat(x)
        if flat.numel() <= self.SMALL:
            full = self._complete_rows(x, tag)
            self._edge_part(tag, _flat(full)[self.edges.src]) if self.wire is not None else None
            combine = canonical_mix if weighted else canonical_neighbour_sum
            return self._mine(combine(full, self.edges), self.row_mask)
        got = self._rows_in(flat, tag)
        held = self.placement.held_rows.to(flat.device)
        result = flat.new_zeros(flat.shape)
        result.index_copy_(0, held, self._held_rows_sum(flat.index_select(0, held), got, tag, weighted=weighted))
        return result.reshape(x.shape)

    def _held_rows_sum(self, own: torch.Tensor, got: dict[int, torch.Tensor], tag: str, *,
                       weighted: bool) -> torch.Tensor:
        """My agents' mix (``weighted``) or neighbour_sum, one row each, from their own rows ``own`` and the rows
        received from each peer (``got``) gathered into the table of the rows they read — reported to the wire as
        the messages my agents receive — by the canonical kernels on those rows (the simulator's bits)."""
        cat = self.wire is None and tuple(got) == self.cat_peers  # the table in arrival order: one cat, no copies in
        # (on the CPU keyed without a device object: .device makes one per call)
        key = (own.dtype, weighted, cat) if own.is_cpu else (own.device, own.dtype, weighted, cat)
        plan = self._on_device.get(key)
        if plan is None:  # once per plan, device, dtype, kind of sum and table layout
            dev = own.device
            _, _, held, position = self._indices(dev)
            at = self.cat_position.to(dev) if cat else position
            plan = self._on_device[key] = (held, at, RowsPlan.of(self.edges, held, at, weighted=weighted,
                                                                  dtype=own.dtype, device=dev, order=self.held_order))
        held, at, rows_plan = plan
        if cat:
            table = torch.cat([own, *got.values()]) if got else own
        else:
            table = self._table(own, got)
            if self.wire is not None:
                e, idx = self.edges, self.mine_in
                src = e.src[idx]
                self._part(tag, idx, src, e.dst[idx], table.index_select(0, self.position[src.long()].to(own.device)))
        return canonical_rows(table, self.edges, held, at, weighted=weighted, plan=rows_plan)

    def _table(self, own: torch.Tensor, got: dict[int, torch.Tensor]) -> torch.Tensor:
        """The rows my agents read, one table row each (row j of the network at ``position[j]``): my agents' own
        rows ``own`` and those each peer sent (``got``)."""
        own_position, in_position, _, _ = self._indices(own.device)
        table = own.new_empty((len(self.read_rows), *own.shape[1:]))
        table.index_copy_(0, own_position, own)
        for p, value in got.items():
            table.index_copy_(0, in_position[p], value)
        return table

    def _mine(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Rows not in ``mask`` set to zero (they belong to other slices)."""
        out = x.clone() if x.shape[0] else x
        out[~mask.to(x.device)] = 0
        return out

    # ---- transmissions --------------------------------------------------------------------------------------------
    def mix(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._meter(tag, self.edges.src, self.edges.dst, x)
        return self._held_sum(x, tag, weighted=True)

    def neighbour_sum(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._meter(tag, self.edges.src, self.edges.dst, x)
        return self._held_sum(x, tag, weighted=False)

    def _mix(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - mix is overridden
        return canonical_mix(x, self.edges)

    def pull(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._meter(tag, self.edges.src, self.edges.dst, x)
        full = self._complete_rows(x, tag)
        v = full[self.edges.src]
        self._edge_part(tag, v)
        return self._mine(v, self.edge_mask)

    def _edge_values(self, values: torch.Tensor, sent: torch.Tensor, tag: str) -> torch.Tensor:
        """``values`` (E, ...) with the entries of my incoming edges from other slices replaced by what they sent:
        ``sent`` is what I send along each of my outgoing edges (indexed by edge)."""
        flat = _flat(sent)
        out = {p: flat[idx] for p, idx in self.edges_out.items()}
        expect = {p: (int(idx.numel()), *flat.shape[1:]) for p, idx in self.edges_in.items()}
        got = self._exchange(tag, out, expect, flat)
        v = _flat(values).clone()
        for p, value in got.items():
            v[self.edges_in[p]] = value
        return v.reshape(values.shape)

    def push(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        # edge e = (j → i) carries per_edge[reverse(e)], computed by j (the receiver of reverse(e))
        back = per_edge[self.edges.reverse]
        self._meter(tag, self.edges.src, self.edges.dst, per_edge)
        v = self._edge_values(back, back, tag)
        self._edge_part(tag, v)
        return self._mine(v, self.edge_mask)

    def send(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        if per_edge.shape[0] != len(self.edges):
            raise ValueError(f"send needs one value per edge ({len(self.edges)}), got {per_edge.shape[0]}")
        self._meter(tag, self.edges.src, self.edges.dst, per_edge)
        v = self._edge_values(per_edge, per_edge, tag)
        self._edge_part(tag, v)
        return self._mine(v, self.edge_mask)

    def average(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        """Through the aggregator (hosted by slice 0): it receives every held row, computes the simulator's mean of
        the complete tensor and sends it back."""
        flat = _flat(x)
        held, to_server = self._to_aggregator(flat, tag)
        self._part(tag, held, held, to_server, flat[held]) if self.wire is not None else None
        mean = self._aggregate(flat[held], tag, x.shape[1:])
        out = mean.expand(self.groups, self.rows // self.groups, *x.shape[1:]).reshape(x.shape).clone()
        self._part(tag, held, to_server, held, _flat(out)[held]) if self.wire is not None else None
        return out

    def _to_aggregator(self, flat: torch.Tensor, tag: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Meter :meth:`average`'s messages (``tag``) of ``flat``'s rows — every agent's to the aggregator (``SERVER``) and
        back, as the simulator counts them — and return (my held rows, ``SERVER`` per held row) on ``flat``'s
        device: the ends made once per plan and device (the meter then counts them from its cache)."""
        key = ("average", flat.device)
        ends = self._on_device.get(key)
        if ends is None:
            every = torch.arange(self.rows, device=flat.device)
            held = self.placement.held_rows.to(flat.device)
            ends = self._on_device[key] = (every, torch.full_like(every, SERVER), held, torch.full_like(held, SERVER))
        every, server, held, to_server = ends
        self._meter(tag, every, server, flat)
        self._meter(tag, server, every, flat)
        return held, to_server

    def _aggregate(self, mine: torch.Tensor, tag: str, tail: tuple) -> torch.Tensor:
        """The trusted aggregator of :meth:`average`, hosted by slice 0: every slice sends it its agents' rows
        ``mine`` (its held rows, increasing; flat); slice 0 puts them in a tensor of the network's rows — the messages
        it receives — and computes the simulator's mean of it (rows shaped ``tail``), which every slice receives:
        (groups, 1, *tail)."""
        dev = mine.device
        if self.part == 0:
            full = mine.new_empty((self.rows, *mine.shape[1:]))
            full[self.placement.held_rows.to(dev)] = mine
            for p in self.peers:
                their = torch.from_numpy(np.flatnonzero(self.owner == p))
                header = (self.t, tag, self.seq, str(mine.dtype), (int(their.numel()), *mine.shape[1:]))
                full[their.to(dev)] = self.transport.recv(p, 0, header).to(dev)
            mean = full.reshape(self.groups, self.rows // self.groups, *tail).mean(dim=1, keepdim=True)
            for p in self.peers:
                self.transport.send(0, p, (self.t, tag, self.seq + 1, str(mean.dtype), tuple(mean.shape)), mean)
        else:
            self.transport.send(self.part, 0, self._header(tag, mine), mine)
            shape = (self.groups, 1, *tail)
            mean = self.transport.recv(0, self.part, (self.t, tag, self.seq + 1, str(mine.dtype), shape)).to(dev)
        self.transport.flush(self.part)
        self.seq += 2
        return mean

    def average_in_place(self, x: torch.Tensor, *, tag: str, offset: torch.Tensor | None = None) -> torch.Tensor:
        """The seed-004 authors' sweep (:meth:`Comm.average_in_place`), agent by agent in the same order in every
        slice: before agent k updates, the slices holding its neighbours send their current values to k's slice."""
        flat = _flat(x).clone()
        extra = None if offset is None else _flat(offset)
        e = self.edges
        self._meter(tag, e.src, e.dst, flat)
        if self._sweep is None or self._sweep[0] is not e:
            plan = []
            for k in range(self.rows):
                idx = torch.nonzero(e.dst == k).reshape(-1)
                src = e.src[idx]
                holder = self.owner[src.long().cpu().numpy()]  # (the edges may be on a GPU: the plan's indices too)
                by_peer = {p: src[torch.from_numpy(holder == p).to(src.device)] for p in self.peers}
                mine = src[torch.from_numpy(holder == self.part).to(src.device)]
                plan.append((src, e.dst[idx], torch.zeros(len(idx), dtype=torch.long, device=src.device),
                             torch.tensor([k], device=src.device), by_peer, mine))
            self._sweep = (e, plan)
        share = 1.0 / (self.degree.to(flat.dtype) + 1.0)
        for k, (src, dst, system, rows, by_peer, mine) in enumerate(self._sweep[1]):
            ko = int(self.owner[k])
            if ko == self.part:
                for p in self.peers:
                    need = by_peer[p]
                    if need.numel():
                        header = (self.t, tag, self.seq, str(flat.dtype), (int(need.numel()), *flat.shape[1:]))
                        flat[need] = self.transport.recv(p, self.part, header).to(flat.device)
                values = flat[src]
                self._part(tag, torch.arange(len(src)), src, dst, values) if self.wire is not None else None
                total = flat[rows].index_add(0, system, values) * share[rows]
                flat[rows] = total if extra is None else total + extra[rows]
            else:
                if mine.numel():
                    value = flat[mine]
                    self.transport.send(self.part, ko, self._header(tag, value), value)
                self._part(tag, None) if self.wire is not None else None
            self.transport.flush(self.part)
            self.seq += 1
        return self._mine(flat, self.row_mask).reshape(x.shape)

    def describe(self) -> dict[str, object]:
        return {"comm": type(self).__name__, "rows": self.rows, "edges": len(self.edges), "part": self.part,
                "agents": list(self.placement.agents)}


__all__ = ["SliceComm"]
