"""A Comm for an engine that holds only some agents (a slice), and the transport that joins the slices.

Each slice computes in the network frame (:mod:`privdl.placement`): row i is agent i, but only the held agents'
rows are real. Before a combination, :class:`SliceComm` sends the rows (or per-edge values) its held agents
transmit to the slices that hold their receivers, receives those its held agents are sent, and then runs the
simulator's own canonical combination (:func:`privdl.comm.base.canonical_mix`) on the completed tensor — the same
kernel on the same shape, so a held agent's result equals the simulator's bit for bit. Rows of agents the slice
does not hold come out as zeros.

What crosses between slices is exactly what would cross a process boundary: for each pair of slices and each
call, one tagged payload (the sender's rows or edges for that peer, in canonical order) with a header (round, tag,
sequence, dtype, shape) checked on receipt. :class:`Transport` is the in-process implementation (queues; payloads
are copied, never shared); the distributed runtime implements the same three methods over torch.distributed.

Observers see the wire as the simulator reports it: every slice reports the messages its held agents receive, and
:class:`Wire` sends them to slice 0 over the transport (threads and processes alike), which merges the parts of
each call into one message in the simulator's order.
"""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager
from typing import Sequence

import numpy as np
import torch

from privdl.comm.base import (SERVER, Comm, Observer, RowsPlan, _flat, _slot_sum, canonical_mix,
                              canonical_neighbour_sum, canonical_rows)
from privdl.errors import PrivdlError, ValidationError
from privdl.network.edges import SlotOrder
from privdl.network.network import Network
from privdl.placement import Placement


#: tag prefix of the setup messages (key agreement): counted as setup bytes, apart from the run's payload
SETUP = "privdl/setup/"
#: tag prefix of the runtime's own messages (setup, the coordinator's gathers, the wire for observers): never payload
CONTROL = "privdl/"


def kind_of(tag: str) -> str:
    """"setup", "control" or "payload": how a message's bytes are counted."""
    return "setup" if tag.startswith(SETUP) else "control" if tag.startswith(CONTROL) else "payload"


class TransportError(PrivdlError):
    """A message that did not arrive, or arrived with another header than the receiver expected."""


class Transport:
    """In-process transport between ``parts`` slices: one FIFO queue per ordered pair, payloads copied, headers
    checked; ``agree_max`` is the one control operation (the slices' largest value of an integer: key agreement's
    setup; nothing is agreed inside the round loop). ``fail`` stops every waiting slice (a failed slice never leaves the others hanging);
    ``timeout`` seconds without a message is an error naming the pair and the header."""

    def __init__(self, parts: int, *, timeout: float = 120.0) -> None:
        self.parts, self.timeout = int(parts), float(timeout)
        self._queues = {(a, b): queue.SimpleQueue() for a in range(self.parts) for b in range(self.parts) if a != b}
        self._cond = threading.Condition()
        self._agree: dict[int, list[int]] = {}
        self._agreed: dict[int, int] = {}  # per control operation: slices that have read its result
        self._agree_seq = [0] * self.parts
        self._gathered: dict[int, dict[int, tuple]] = {}  # per gather: the slices' (header, value) so far
        self._gather_seq = [0] * self.parts
        self.failed: tuple[int, BaseException] | None = None
        self.payload_bytes = np.zeros((self.parts, self.parts), dtype=np.int64)
        self.setup_bytes = 0
        self.control_bytes = 0
        self.control_messages = 0
        self.tap = None  # tests: called with the bytes of every header and payload sent

    def fail(self, part: int, error: BaseException) -> None:
        with self._cond:
            if self.failed is None:
                self.failed = (part, error)
            self._cond.notify_all()

    def _check_failed(self, part: int) -> None:
        if self.failed is not None and self.failed[0] != part:
            raise TransportError(f"slice {part} stopped: slice {self.failed[0]} failed "
                                 f"({type(self.failed[1]).__name__}: {self.failed[1]})")

    def flush(self, part: int) -> None:
        """Every message this slice posted is on its way (a distributed transport waits on its sends here)."""

    def exchange(self, part: int, sends: list[tuple[int, tuple, torch.Tensor]],
                 recvs: list[tuple[int, tuple]]) -> dict[int, torch.Tensor]:
        """One Comm call's messages: ``sends`` (receiver, header, payload) posted, then ``recvs`` (sender,
        header) received, headers checked; the payloads by sender."""
        for dst, header, value in sends:
            self.send(part, dst, header, value)
        out = {src: self.recv(src, part, header) for src, header in recvs}
        self.flush(part)
        return out

    def send(self, src: int, dst: int, header: tuple, payload: torch.Tensor) -> None:
        value = payload.detach().clone()
        size, kind = value.numel() * value.element_size(), kind_of(header[1])
        if kind == "payload":
            self.payload_bytes[src, dst] += size
        elif kind == "setup":
            self.setup_bytes += size
        else:
            self.control_bytes += size
        if self.tap is not None:
            self.tap(repr(header).encode() + value.cpu().contiguous().numpy().tobytes())
        self._queues[(src, dst)].put((header, value))

    def recv(self, src: int, dst: int, header: tuple) -> torch.Tensor:
        q = self._queues[(src, dst)]
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                got, value = q.get(timeout=0.05)
                break
            except queue.Empty:
                self._check_failed(dst)
                if time.monotonic() > deadline:
                    raise TransportError(f"slice {dst} waited {self.timeout:g} s for {_describe(header)} from slice "
                                         f"{src}; nothing arrived") from None
        if got != header:
            raise TransportError(f"slice {dst} expected {_describe(header)} from slice {src}, received "
                                 f"{_describe(got)}")
        return value

    def agree_max(self, part: int, value: int) -> int:
        """The largest ``value`` over all slices (every slice calls it at the same point of its run)."""
        with self._cond:
            seq = self._agree_seq[part]
            self._agree_seq[part] += 1
            got = self._agree.setdefault(seq, [])
            got.append(int(value))
            self.control_messages += 1
            self._cond.notify_all()
            deadline = time.monotonic() + self.timeout
            while len(self._agree[seq]) < self.parts:
                self._check_failed(part)
                if time.monotonic() > deadline:
                    raise TransportError(f"slice {part} waited {self.timeout:g} s for the other slices to agree "
                                         f"(control operation {seq})")
                self._cond.wait(0.05)
            out = max(self._agree[seq])
            self._agreed[seq] = self._agreed.get(seq, 0) + 1
            if self._agreed[seq] == self.parts:  # every slice has its answer: forget the operation
                del self._agree[seq], self._agreed[seq]
            return out


    def gather(self, part: int, t: int, tag: str, value: torch.Tensor,
               shapes: Sequence[tuple[int, ...]]) -> list[torch.Tensor] | None:
        """Every slice's ``value`` of round ``t`` at slice 0, in slice order (its own first; ``shapes[k]``: the
        shape slice k sends, checked with the dtype and the tag); the others hand theirs over (a copy, counted as
        control bytes) and go on: None. Every slice calls it at the same point of its run; the coordinator's
        operation (:class:`privdl.simulator.coordinator.Coordinator`), never a Comm's payload."""
        header = (t, tag, -1, str(value.dtype), tuple(value.shape))
        with self._cond:
            seq = self._gather_seq[part]
            self._gather_seq[part] += 1
            if part:
                copy = value.detach().clone()
                self.control_bytes += copy.numel() * copy.element_size()
                if self.tap is not None:
                    self.tap(repr(header).encode() + copy.cpu().contiguous().numpy().tobytes())
                self._gathered.setdefault(seq, {})[part] = (header, copy)
                self._cond.notify_all()
                return None
            deadline = time.monotonic() + self.timeout
            while len(self._gathered.get(seq, ())) < self.parts - 1:
                self._check_failed(part)
                if time.monotonic() > deadline:
                    missing = [k for k in range(1, self.parts) if k not in self._gathered.get(seq, {})]
                    raise TransportError(f"slice 0 waited {self.timeout:g} s for {_describe(header)} from slice "
                                         f"{missing[0]}; nothing arrived")
                self._cond.wait(0.05)
            got = self._gathered.pop(seq, {})
        out = [value]
        for k in range(1, self.parts):
            want = (t, tag, -1, str(value.dtype), tuple(shapes[k]))
            if got[k][0] != want:
                raise TransportError(f"slice 0 expected {_describe(want)} from slice {k}, received "
                                     f"{_describe(got[k][0])}")
            out.append(got[k][1])
        return out


def _describe(header: tuple) -> str:
    t, tag, seq, dtype, shape = header
    return f"round {t}, tag {tag!r}, message {seq} ({dtype}, shape {tuple(shape)})"


#: the dtypes a message may carry, by code (the distributed transport's header and the wire's size message)
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]
DTYPE_CODE = {str(d): k for k, d in enumerate(DTYPES)}
#: the wire's tag (control traffic: it exists only when a run has observers, and is counted apart from the payload)
WIRE = CONTROL + "wire"
#: int64 entries of the wire's size message: entries, payload dtype, index dtype, payload ndim − 1, its shape
WIRE_META = 16


class Wire:
    """Slice ``part``'s end of the wire of a run with observers (the eavesdropper), over ``transport``'s point to
    point messages — the same code for the sliced backend's threads and the distributed runtime's processes. Every
    slice but 0 sends slice 0 its part of each transmission, the messages its agents receive (tag ``privdl/wire``:
    a size message, then the entries' positions, senders and receivers, then their payloads); slice 0 receives the
    parts, merges them into the message the simulator reports (entries in the simulator's order) and hands it to
    ``observers``, call by call, in order."""

    def __init__(self, part: int, parts: int, transport, observers: Sequence[Observer]) -> None:
        self.part, self.parts, self.transport = int(part), int(parts), transport
        self.observers = list(observers) if self.part == 0 else []

    def report(self, seq: int, t: int, tag: str, entry: tuple | None) -> None:
        """This slice's part of transmission ``seq`` (round ``t``, ``tag``): ``entry`` = (positions in the
        simulator's message, senders, receivers, payloads), or None (its agents receive nothing)."""
        if self.part:
            self._send(seq, t, entry)
            return
        parts = [entry] + [self._receive(seq, t, k) for k in range(1, self.parts)]
        # on the CPU: the other slices' parts arrive as control messages (kept there: privdl.runtime.transport's
        # Staging), slice 0's own may be on its GPU; observers read the wire on the CPU
        entries = [tuple(x.cpu() for x in e) for e in parts if e is not None and e[0].numel()]
        if not entries:
            return
        order = torch.cat([e[0] for e in entries])
        perm = torch.argsort(order, stable=True)
        src = torch.cat([e[1] for e in entries])[perm]
        dst = torch.cat([e[2] for e in entries])[perm]
        payload = torch.cat([e[3] for e in entries])[perm]
        for o in self.observers:
            o.on_message(t=t, tag=tag, src=src, dst=dst, payload=payload)

    def _send(self, seq: int, t: int, entry: tuple | None) -> None:
        meta = torch.full((WIRE_META,), -1, dtype=torch.int64)
        meta[0] = 0 if entry is None else int(entry[0].numel())
        if int(meta[0]):
            order, src, dst, payload = entry
            shape = tuple(payload.shape[1:])
            if len(shape) > WIRE_META - 4:
                raise TransportError(f"a wire payload of {len(shape) + 1} dimensions does not fit the size message")
            meta[1:4] = torch.tensor([DTYPE_CODE[str(payload.dtype)], DTYPE_CODE[str(src.dtype)], len(shape)])
            meta[4:4 + len(shape)] = torch.tensor(shape, dtype=torch.int64)
        self.transport.send(self.part, 0, (t, WIRE, seq, "torch.int64", (WIRE_META,)), meta)
        if int(meta[0]):
            index = torch.stack([order.long().cpu(), src.long().cpu(), dst.long().cpu()])
            self.transport.send(self.part, 0, (t, WIRE, seq, "torch.int64", tuple(index.shape)), index)
            self.transport.send(self.part, 0, (t, WIRE, seq, str(payload.dtype), tuple(payload.shape)), payload)
        self.transport.flush(self.part)

    def _receive(self, seq: int, t: int, k: int) -> tuple | None:
        meta = self.transport.recv(k, 0, (t, WIRE, seq, "torch.int64", (WIRE_META,))).tolist()
        m = meta[0]
        if not m:
            return None
        if not (0 <= meta[1] < len(DTYPES) and 0 <= meta[2] < len(DTYPES) and 0 <= meta[3] <= WIRE_META - 4):
            raise TransportError(f"slice {k} sent slice 0 a wire size message it cannot read: {meta}")
        index = self.transport.recv(k, 0, (t, WIRE, seq, "torch.int64", (3, m)))
        shape = (m, *meta[4:4 + meta[3]])
        payload = self.transport.recv(k, 0, (t, WIRE, seq, str(DTYPES[meta[1]]), shape))
        kind = DTYPES[meta[2]]
        return index[0], index[1].to(kind), index[2].to(kind), payload


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
        t, seq, dev = self.t, self.seq, like.device
        sends = [(p, (t, tag, seq, str(value.dtype), tuple(value.shape)), value) for p, value in out.items()
                 if value.shape[0]]
        dtype = str(like.dtype)
        recvs = [(p, (t, tag, seq, dtype, shape)) for p, shape in expect.items() if shape[0]]
        got = self.transport.exchange(self.part, sends, recvs)
        self.seq += 1
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
        dev = own.device
        _, _, held, position = self._indices(dev)
        if self.wire is None and tuple(got) == self.cat_peers:  # the table in arrival order: one cat, no copies in
            key = (dev, own.dtype, weighted, "cat")
            got_plan = self._on_device.get(key)
            if got_plan is None:
                at = self.cat_position.to(dev)
                got_plan = self._on_device[key] = (at, RowsPlan.of(self.edges, held, at, weighted=weighted,
                                                                   dtype=own.dtype, device=dev,
                                                                   order=self.held_order))
            table = torch.cat([own, *got.values()]) if got else own
            return canonical_rows(table, self.edges, held, got_plan[0], weighted=weighted, plan=got_plan[1])
        table = self._table(own, got)
        if self.wire is not None:
            e, idx = self.edges, self.mine_in
            src = e.src[idx]
            self._part(tag, idx, src, e.dst[idx], table.index_select(0, self.position[src.long()].to(dev)))
        key = (dev, table.dtype, weighted)
        plan = self._on_device.get(key)
        if plan is None:  # once per plan, device, dtype and kind of sum
            plan = self._on_device[key] = RowsPlan.of(self.edges, held, position, weighted=weighted,
                                                      dtype=table.dtype, device=dev, order=self.held_order)
        return canonical_rows(table, self.edges, held, position, weighted=weighted, plan=plan)

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
        held = self.placement.held_rows.to(x.device)
        rows = torch.arange(self.rows, device=x.device)
        server = torch.full_like(rows, SERVER)
        self._meter(tag, rows, server, flat, cache=False)
        self._meter(tag, server, rows, flat, cache=False)
        self._part(tag, held, held, server[held], flat[held]) if self.wire is not None else None
        mean = self._aggregate(flat[held], tag, x.shape[1:])
        out = mean.expand(self.groups, self.rows // self.groups, *x.shape[1:]).reshape(x.shape).clone()
        self._part(tag, held, server[held], held, _flat(out)[held]) if self.wire is not None else None
        return out

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


#: the Comm methods a held-frame engine supports (each agent's result from its own and its in-neighbours' rows, or
#: per-edge values of the edges its agents send along or receive)
HELD_METHODS = ("mix", "neighbour_sum", "pull", "push", "send", "reduce", "average")


class HeldComm(SliceComm):
    """The Comm of slice ``part`` in the *held frame* (:mod:`privdl.placement`): its tensors have one row per agent
    it holds (row r is ``placement.agents[r]``), never one per agent of the network. ``mix`` and ``neighbour_sum``
    send each peer the local rows its agents read, gather the rows the held agents read into a table and run the
    simulator's canonical summation on it (:func:`privdl.comm.base.canonical_rows`: each held row's result is the
    same operations on the same numbers as the simulator's, so the same bits) — nothing of size n·d is built, but
    by slice 0's aggregator for ``average`` (the messages it receives: the centralized baseline's server).

    Per-edge tensors have one row per edge its agents *receive* (``edges_received``: the ids, in ``self.edges``, of
    the held agents' incoming edges, canonical order) — what ``pull``, ``push`` and ``send`` return and what
    ``push`` and ``reduce`` take — except ``send``'s input, one row per edge its agents *send* along
    (``edges_sent``: edges whose sender is held, canonical order). ``received_by`` / ``sent_from`` are the local rows
    of those edges' receivers / senders; ``frame_agents`` the global agent of each local row. Each per-edge value
    crosses to the receiver's slice alone, and every entry is the simulator's (a copy of a value; ``reduce`` sums in
    canonical order, the same bits). ``average`` runs through slice 0's aggregator as in the network frame;
    ``average_in_place`` (a sweep agent by agent over the whole network) is refused: an algorithm that calls it runs
    in the network frame (``runtime.frame = "network"``). ``algorithm`` names the algorithm in that error."""

    INDEX = SliceComm.INDEX + ("_degree",)

    def __init__(self, network: Network, placement: Placement, part: int, owner: np.ndarray, transport: Transport,
                 wire: Wire | None = None, *, algorithm: str = "this algorithm") -> None:
        self.algorithm = algorithm
        super().__init__(network, placement, part, owner, transport, wire)

    def _plan(self, e) -> None:
        super()._plan(e)
        held = self.placement.held_rows
        local = torch.full((self.rows,), -1, dtype=torch.long)
        local[held] = torch.arange(held.numel())
        self.local_out = {p: local[r] for p, r in self.rows_out.items()}  # my local rows each peer reads
        self._sends: tuple | None = None  # (device, row shape, local_out there, expected shapes): _held_sum
        self._degree = e.degree.index_select(0, held.to(e.degree.device))[:, None]
        self._local, self._edge_plan = local, None  # the per-edge plan: made on the first per-edge call

    def _edges_plan(self) -> dict:
        """The per-edge frame of the current edge set (:meth:`pull`, :meth:`push`, :meth:`send`, :meth:`reduce`):
        the edges my agents receive and send along, each one's place in those lists and its local row, and for each
        peer where what it sends me lands and what I send it comes from. Made once per edge set, on first use (an
        algorithm that only mixes never builds it)."""
        if self._edge_plan is not None and self._edge_plan["edges"] is self.edges:
            return self._edge_plan
        e = self.edges
        count = len(e)
        # built on the CPU (the owner table is numpy), whatever device the Comm's plan was moved to (:meth:`to`);
        # the per-edge methods move what they index with to the values' device
        src, dst = e.src.long().cpu(), e.dst.long().cpu()
        received = self.mine_in.cpu()
        sent = torch.from_numpy(np.flatnonzero(self.owner[src.numpy()] == self.part))
        at_received = torch.full((count,), -1, dtype=torch.long)
        at_received[received] = torch.arange(received.numel())
        at_sent = torch.full((count,), -1, dtype=torch.long)
        at_sent[sent] = torch.arange(sent.numel())
        reverse = e.reverse.long().cpu() if e.reverse.numel() == count else None
        here = torch.from_numpy(self.owner[src[received].numpy()] == self.part)  # received from my own agents
        local = received[here]
        plan = {
            "edges": e, "received": received, "sent": sent, "at_received": at_received,
            "received_by": self._local[dst[received]], "sent_from": self._local[src[sent]],
            "read_at": self.position.cpu()[src[received]],  # pull: each received edge's sender in the rows table
            # send: my own agents' edges, from the sent list to the received list; peers' land at at_received
            "local_at": at_received[local], "local_from_sent": at_sent[local],
            "out_sent": {p: at_sent[r.cpu()] for p, r in self.edges_out.items()},
            "in_at": {p: at_received[r.cpu()] for p, r in self.edges_in.items()},
        }
        if reverse is not None:  # push: edge e (j → i) carries what j computed for its received edge reverse(e)
            plan["local_from_reverse"] = at_received[reverse[local]]
            plan["out_reverse"] = {p: at_received[reverse[r.cpu()]] for p, r in self.edges_out.items()}
        self._edge_plan = plan
        return plan

    def _edges_on(self, device: torch.device) -> dict:
        """:meth:`_edges_plan`'s index tensors on ``device``, moved once per edge set and device (the per-edge
        methods index there every call; a ``.to`` per index and call is measurable on a GPU)."""
        plan = self._edges_plan()
        moved = plan.setdefault("on", {})
        got = moved.get(device)
        if got is None:
            got = moved[device] = {k: {p: t.to(device) for p, t in v.items()} if isinstance(v, dict) else v.to(device)
                                   for k, v in plan.items() if k not in ("edges", "on")}
        return got

    @property
    def frame_agents(self) -> torch.Tensor:
        """The global agent of each row of this engine's tensors (``placement.held_rows``), increasing."""
        return self.placement.held_rows

    @property
    def edges_received(self) -> torch.Tensor:
        """Ids (in ``self.edges``) of the edges my agents receive, canonical order: the rows of per-edge tensors."""
        return self._edges_plan()["received"]

    @property
    def edges_sent(self) -> torch.Tensor:
        """Ids of the edges my agents send along, canonical order: the rows of :meth:`send`'s input."""
        return self._edges_plan()["sent"]

    @property
    def received_by(self) -> torch.Tensor:
        """The local row of each received edge's receiver."""
        return self._edges_plan()["received_by"]

    @property
    def sent_from(self) -> torch.Tensor:
        """The local row of each sent edge's sender."""
        return self._edges_plan()["sent_from"]

    @property
    def frame_rows(self) -> int:
        """Rows of this engine's tensors: its agents."""
        return len(self.placement.agents)

    @property
    def degree(self) -> torch.Tensor:
        """Number of neighbours of each held agent, (m, 1)."""
        return self._degree

    def _held_sum(self, x: torch.Tensor, tag: str, *, weighted: bool) -> torch.Tensor:
        flat = x if x.dim() == 2 else _flat(x)  # (a reshape per call and back is measurable on a small model)
        if flat.shape[0] != self.frame_rows:
            raise ValidationError(f"a held-frame Comm combines one row per held agent ({self.frame_rows}), got a "
                                  f"tensor of {flat.shape[0]} rows")
        out = self._held_rows_sum(flat, self._rows_exchange(flat, tag), tag, weighted=weighted)
        return out if x.dim() == 2 else out.reshape(x.shape)

    def _rows_exchange(self, flat: torch.Tensor, tag: str) -> dict[int, torch.Tensor]:
        """Send each peer the rows of mine its agents read, and receive the rows mine read from each peer (what
        :meth:`mix` and :meth:`pull` exchange). What to send and what to expect is made once per plan, device and
        row shape."""
        sends = self._sends
        if sends is None or sends[0] != flat.device or sends[1] != flat.shape[1:]:  # once per plan, device, width
            every = torch.arange(flat.shape[0])  # a peer that reads all my rows in order gets them uncopied
            sends = self._sends = (flat.device, flat.shape[1:],
                                   {p: None if torch.equal(r, every) else r.to(flat.device)
                                    for p, r in self.local_out.items()},
                                   {p: (int(r.numel()), *flat.shape[1:]) for p, r in self.rows_in.items()})
        return self._exchange(tag, {p: flat if r is None else flat[r] for p, r in sends[2].items()}, sends[3], flat)

    def _refuse(self, method: str, why: str):
        supported = f"{', '.join(HELD_METHODS[:-1])} and {HELD_METHODS[-1]}"
        raise ValidationError(f"algorithm {self.algorithm!r} calls comm.{method} ({why}); the held frame "
                              f"(runtime.frame = \"held\") supports {supported} only: run it with "
                              "runtime.frame = \"network\"")

    # ---- per-edge transmissions in the held frame: one row per edge my agents receive (send: send along) ----------
    def _check_rows(self, flat: torch.Tensor, want: int, what: str, method: str) -> None:
        if flat.shape[0] != want:
            raise ValidationError(f"a held-frame Comm's {method} takes one row per {what} ({want}), got a tensor of "
                                  f"{flat.shape[0]} rows")

    def _received_part(self, tag: str, values: torch.Tensor) -> None:
        """Report to the wire the messages my agents receive (one per received edge, the simulator's entries)."""
        if self.wire is not None:
            idx, e = self.mine_in, self.edges
            self._part(tag, idx, e.src[idx], e.dst[idx], values)

    def pull(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        """x_src(e) for every edge e my agents receive, (received, ...): from my own rows and those the peers send
        (the rows my agents read, as :meth:`mix`)."""
        flat = _flat(x)
        self._check_rows(flat, self.frame_rows, "held agent", "pull")
        self._meter(tag, self.edges.src, self.edges.dst, x)
        table = self._table(flat, self._rows_exchange(flat, tag))
        v = table.index_select(0, self._edges_on(flat.device)["read_at"])
        self._received_part(tag, v)
        return v.reshape(-1, *x.shape[1:])

    def _deliver(self, flat: torch.Tensor, tag: str, local_from: str, out_from: str) -> torch.Tensor:
        """The received list's values: entry ``local_at`` from my own ``flat[plan[local_from]]``, and from each peer
        what it sends (my entries ``in_at[p]``); each peer gets ``flat[plan[out_from][p]]`` (its entries, in its
        order) — ``plan``: :meth:`_edges_plan` on ``flat``'s device."""
        plan = self._edges_on(flat.device)
        out = {p: flat.index_select(0, idx) for p, idx in plan[out_from].items()}
        expect = {p: (int(idx.numel()), *flat.shape[1:]) for p, idx in plan["in_at"].items()}
        got = self._exchange(tag, out, expect, flat)
        v = flat.new_empty((plan["received"].numel(), *flat.shape[1:]))
        v.index_copy_(0, plan["local_at"], flat.index_select(0, plan[local_from]))
        for p, value in got.items():
            v.index_copy_(0, plan["in_at"][p], value)
        return v

    def push(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        """Edge e = (j → i) that my agent i receives carries per_edge[reverse(e)]: what j computed for its received
        edge (i → j). ``per_edge`` and the result have one row per edge my agents receive."""
        flat = _flat(per_edge)
        plan = self._edges_plan()
        self._check_rows(flat, plan["received"].numel(), "edge its agents receive", "push")
        if "out_reverse" not in plan:
            raise ValidationError("comm.push needs every edge's reverse (an undirected network)")
        self._meter(tag, self.edges.src, self.edges.dst, per_edge)
        v = self._deliver(flat, tag, "local_from_reverse", "out_reverse")
        self._received_part(tag, v)
        return v.reshape(-1, *per_edge.shape[1:])

    def send(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        """``per_edge`` has one row per edge my agents send along (``edges_sent``); the result one per edge they
        receive: the value its sender put on it."""
        flat = _flat(per_edge)
        plan = self._edges_plan()
        self._check_rows(flat, plan["sent"].numel(), "edge its agents send along", "send")
        self._meter(tag, self.edges.src, self.edges.dst, per_edge)
        v = self._deliver(flat, tag, "local_from_sent", "out_sent")
        self._received_part(tag, v)
        return v.reshape(-1, *per_edge.shape[1:])

    def reduce(self, per_edge: torch.Tensor, *, weight=None) -> torch.Tensor:
        """Σ_{e: dst(e) = i} weight_e · per_edge[e] for each held agent i, in canonical order (no message; the
        simulator's bits): ``per_edge`` has one row per edge my agents receive, ``weight`` is ``"mixing"``, None, or
        one weight per received edge."""
        flat = _flat(per_edge)
        plan = self._edges_plan()
        self._check_rows(flat, plan["received"].numel(), "edge its agents receive", "reduce")
        e = self.edges
        if isinstance(weight, str):
            if weight != "mixing":
                raise ValueError(f"weight must be a tensor, 'mixing' or None, got {weight!r}")
            w = e.weight
        elif weight is None:
            w = None
        else:
            w = torch.as_tensor(weight).reshape(-1)
            self._check_rows(w[:, None], plan["received"].numel(), "edge its agents receive", "reduce weight")
            w = w.new_zeros(len(e)).index_copy_(0, self._edges_on(w.device)["received"], w)
        out = flat.new_zeros((self.frame_rows, flat.shape[1]))
        out = _slot_sum(out, e, flat, w, position=self._edges_on(flat.device)["at_received"], order=self.held_order)
        return out.reshape(self.frame_rows, *per_edge.shape[1:])

    def average(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        """Through the aggregator hosted by slice 0, as in the network frame: each slice sends it its agents' rows and
        each held agent receives the simulator's mean (the same operations on the same numbers: the same bits). The
        aggregator's tensor of every agent's row is the messages it receives — slice 0's alone; every other slice
        holds its own rows and the mean."""
        flat = _flat(x)
        self._check_rows(flat, self.frame_rows, "held agent", "average")
        held = self.placement.held_rows.to(flat.device)
        every = torch.arange(self.rows, device=flat.device)
        server = torch.full_like(every, SERVER)
        self._meter(tag, every, server, flat, cache=False)
        self._meter(tag, server, every, flat, cache=False)
        self._part(tag, held, held, server[:held.numel()], flat) if self.wire is not None else None
        mean = self._aggregate(flat, tag, x.shape[1:])  # (1, 1, ...): a sliced run holds one system (groups = 1)
        out = mean.reshape(1, *x.shape[1:]).expand(x.shape).clone()
        self._part(tag, held, server[:held.numel()], held, _flat(out)) if self.wire is not None else None
        return out

    def average_in_place(self, x: torch.Tensor, *, tag: str, offset: torch.Tensor | None = None) -> torch.Tensor:
        self._refuse("average_in_place", "the seed-004 authors' sweep, agent by agent over the whole network")

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "frame": "held"}


__all__ = ["HELD_METHODS", "HeldComm", "SliceComm", "Transport", "TransportError", "Wire"]
