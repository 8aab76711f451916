"""The Comm of an engine in the held frame (:mod:`privdl.placement`): one row per agent it holds, never one per agent
of the network (:class:`HeldComm`, a :class:`privdl.comm.sliced.SliceComm` whose tensors are its agents' rows and
the edges they receive or send along).
"""

from __future__ import annotations

import numpy as np
import torch

from privdl.comm.base import _flat, _slot_sum
from privdl.comm.sliced import SliceComm
from privdl.comm.transport import Transport
from privdl.comm.wire import Wire
from privdl.errors import ValidationError
from privdl.network.network import Network
from privdl.placement import Placement


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
        self._sends: tuple | None = None  # what _rows_exchange sends and expects, per dtype, row shape, device
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
        if sends is None or sends[0] is not flat.dtype or sends[1] != flat.shape[1:] or sends[2] != flat.device:
            every = torch.arange(flat.shape[0])  # a peer that reads all my rows in order gets them uncopied
            tail = tuple(flat.shape[1:])
            sends = self._sends = (  # once per plan, dtype, width and device; peers with no rows to move left out
                flat.dtype, flat.shape[1:], flat.device, str(flat.dtype),
                tuple((p, None if torch.equal(r, every) else r.to(flat.device), (int(r.numel()), *tail))
                      for p, r in self.local_out.items() if r.numel()),
                tuple((p, (int(r.numel()), *tail)) for p, r in self.rows_in.items() if r.numel()))
        t, seq, dtype = self.t, self.seq, sends[3]
        return self._send_receive([(p, (t, tag, seq, dtype, shape), flat if r is None else flat.index_select(0, r))
                                   for p, r, shape in sends[4]],
                                  [(p, (t, tag, seq, dtype, shape)) for p, shape in sends[5]], flat)

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
        held, to_server = self._to_aggregator(flat, tag)
        self._part(tag, held, held, to_server, flat) if self.wire is not None else None
        mean = self._aggregate(flat, tag, x.shape[1:])  # (1, 1, ...): a sliced run holds one system (groups = 1)
        out = mean.reshape(1, *x.shape[1:]).expand(x.shape).clone()
        self._part(tag, held, to_server, held, _flat(out)) if self.wire is not None else None
        return out

    def average_in_place(self, x: torch.Tensor, *, tag: str, offset: torch.Tensor | None = None) -> torch.Tensor:
        self._refuse("average_in_place", "the seed-004 authors' sweep, agent by agent over the whole network")

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "frame": "held"}


__all__ = ["HELD_METHODS", "HeldComm"]
