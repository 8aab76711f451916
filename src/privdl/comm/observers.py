"""Observers of the wire, and replaying a transcript as one agent's view.

* :class:`Transcript` records every message (t, tag, src, dst, payload) — what an eavesdropper on every link sees.
* :class:`ByteCounter` counts messages and payload bytes per tag.
* :class:`ReplayComm` serves one agent, in a later run, exactly the messages it received in a recorded run (every
  other row is NaN). If the agent's iterates come out the same, the agent's computation used nothing but its own
  state and what reached it through the Comm (the transcript-completeness property, tested for every algorithm).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from privdl.comm.base import SERVER, Comm
from privdl.errors import ValidationError


@dataclass(frozen=True)
class Message:
    """One transmission call as the wire saw it: ``payload[k]`` travelled from ``src[k]`` to ``dst[k]``."""

    t: int
    tag: str
    src: torch.Tensor
    dst: torch.Tensor
    payload: torch.Tensor


class Transcript:
    """Records every message (payloads copied). ``messages`` is in call order."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    def on_message(self, *, t: int, tag: str, src: torch.Tensor, dst: torch.Tensor, payload: torch.Tensor) -> None:
        self.messages.append(Message(t, tag, src.clone(), dst.clone(), payload.detach().clone()))

    def _entries(self, keep) -> list[Message]:
        """Every message restricted to its entries where ``keep(message)`` (a boolean per entry) holds."""
        out = []
        for m in self.messages:
            sel = keep(m)
            if bool(sel.any()):
                out.append(Message(m.t, m.tag, m.src[sel], m.dst[sel], m.payload[sel]))
        return out

    def received_by(self, agent: int) -> list[Message]:
        """The messages addressed to ``agent`` (each restricted to its entries with dst = agent)."""
        return self._entries(lambda m: m.dst == agent)

    def sent_by(self, agent: int) -> list[Message]:
        """The messages ``agent`` transmitted (each restricted to its entries with src = agent): its own state."""
        return self._entries(lambda m: m.src == agent)

    def view_of(self, agent: int) -> list[Message]:
        """What a curious ``agent`` holds of the wire: the messages addressed to it and those it sent."""
        return self.received_by(agent) + self.sent_by(agent)

    def tags(self) -> list[tuple[int, str]]:
        return [(m.t, m.tag) for m in self.messages]


class ByteCounter:
    """Messages and payload bytes per tag (a message is one (src, dst) pair)."""

    def __init__(self) -> None:
        self.messages: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)

    def on_message(self, *, t: int, tag: str, src: torch.Tensor, dst: torch.Tensor, payload: torch.Tensor) -> None:
        self.messages[tag] += int(src.numel())
        self.bytes[tag] += int(payload.numel()) * payload.element_size()

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def add_per_tag(*parts: dict) -> dict:
    """Per-tag counts ({tag: {"bytes_sent", "bytes_received", "messages"}}) added up, tags in first-seen order."""
    out: dict[str, dict[str, int]] = {}
    for part in parts:
        for tag, v in part.items():
            acc = out.setdefault(tag, {"bytes_sent": 0, "bytes_received": 0, "messages": 0})
            for k in acc:
                acc[k] += int(v.get(k, 0))
    return out


def totals_of(per_tag: dict) -> np.ndarray:
    """(bytes sent, bytes received) of per-tag counts."""
    return np.array([sum(v["bytes_sent"] for v in per_tag.values()),
                     sum(v["bytes_received"] for v in per_tag.values())], dtype=np.int64)


class AgentBytes:
    """Payload bytes each agent sends and receives, per tag: what :class:`ByteCounter` counts, split by agent and
    computed from shapes alone (a Comm calls :meth:`count` when this is its ``meter``; no payload is gathered, so
    it costs one small addition per call). A message is one (sender, receiver) pair carrying one row of the
    payload, counted at its sender (at its receiver when the aggregator of ``average``, ``SERVER``, sent it: the
    aggregator is no agent). ``held`` (a slice): count only the ends of these agents — the slices' counts then add
    up to the network's. ``metrics(t, rows)`` gives the recorder ``bytes_sent`` / ``bytes_received`` (the rows'
    totals since round 0) at recorded rounds.

    State (checkpoints): per row and tag, so a stacked batch's state splits into its runs' (:func:`slice_state`) and
    joins again (:func:`join_states`); a coordinator's state (:class:`privdl.simulator.coordinator.NetworkBytes`) holds
    per-tag totals only (``base``), which a resumed run adds to what it counts from there."""

    CACHE = 32  # (src, dst) pairs whose degree counts are kept (the edges' tensors: the same objects every call)

    def __init__(self, rows: int, held: np.ndarray | None = None) -> None:
        self.rows = int(rows)
        self.held = np.ones(self.rows, dtype=bool) if held is None else np.asarray(held, dtype=bool)
        self._sent: dict[str, np.ndarray] = {}
        self._received: dict[str, np.ndarray] = {}
        self._messages: dict[str, np.ndarray] = {}
        # per-tag totals carried from checkpoints that kept only totals: (first row, end row, counts) each
        self.bases: list[tuple[int, int, dict]] = []
        self._ends: dict[tuple[int, int], tuple] = {}
        #: calls counted but not yet added to the arrays, per (tag, ends): [ends' counts, calls, Σ width] — a call
        #: is one dict update; the arrays are brought up to date when read (:meth:`_settle`), exactly (integers)
        self._pending: dict[tuple, list] = {}

    def _settle(self) -> None:
        """Add the pending calls to the per-tag arrays: sent += out · Σ width, received += into · Σ width,
        messages += messages · calls (the sums of what each call would have added: the same integers)."""
        pending, self._pending = self._pending, {}
        for (tag, _), (hit, calls, width) in pending.items():
            _, _, out, into, messages = hit
            if tag not in self._sent:
                self._sent[tag], self._received[tag], self._messages[tag] = (np.zeros(self.rows, dtype=np.int64)
                                                                          for _ in range(3))
            self._sent[tag] += out * width
            self._received[tag] += into * width
            self._messages[tag] += messages * calls

    @property
    def sent(self) -> dict[str, np.ndarray]:
        """Payload bytes each row sent, per tag."""
        self._settle()
        return self._sent

    @property
    def received(self) -> dict[str, np.ndarray]:
        """Payload bytes each row received, per tag."""
        self._settle()
        return self._received

    @property
    def messages(self) -> dict[str, np.ndarray]:
        """Messages each row counts (sent, or received from the aggregator), per tag."""
        self._settle()
        return self._messages

    def _counts(self, src: torch.Tensor, dst: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        s, d = src.detach().cpu().numpy(), dst.detach().cpu().numpy()
        if len(s) and s.min() >= 0 and d.min() >= 0:  # agent to agent (no server end): no masks (a new W(t) each
            out = np.bincount(s, minlength=self.rows)   # round of a time-varying graph comes here every round)
            return out * self.held, np.bincount(d, minlength=self.rows) * self.held, out * self.held
        s, d = s.astype(np.int64, copy=False), d.astype(np.int64, copy=False)
        out = np.bincount(s[s >= 0], minlength=self.rows) * self.held
        into = np.bincount(d[d >= 0], minlength=self.rows) * self.held
        at = np.where(s >= 0, s, d)  # the agent end that counts the message
        return out, into, np.bincount(at[at >= 0], minlength=self.rows) * self.held

    def count(self, tag: str, src: torch.Tensor, dst: torch.Tensor, width: int, *, cache: bool = True) -> None:
        """One call of ``tag``: message k from src[k] to dst[k], each ``width`` bytes. ``cache``: src and dst are
        tensors that come back every call (the edges'), whose counts are kept."""
        hit = self._ends.get((id(src), id(dst))) if cache else None
        if hit is None or hit[0] is not src or hit[1] is not dst:
            hit = (src, dst, *self._counts(src, dst))
            if cache:
                if len(self._ends) >= self.CACHE:
                    self._ends.clear()
                self._ends[(id(src), id(dst))] = hit
        key = (tag, id(hit))  # (the pending entry holds hit: its id is not reused while the entry lives)
        got = self._pending.get(key)
        if got is None:
            if len(self._pending) >= self.CACHE:  # (calls with fresh ends, such as average's, each add an entry)
                self._settle()
            self._pending[key] = [hit, 1, int(width)]
        else:
            got[1] += 1
            got[2] += int(width)

    def per_tag(self, rows: slice | None = None) -> dict[str, dict[str, int]]:
        """Bytes and messages per tag of ``rows`` (all), the carried base included."""
        r = slice(None) if rows is None else rows
        lo, hi, _ = r.indices(self.rows)
        mine = {tag: {"bytes_sent": int(self.sent[tag][r].sum()), "bytes_received": int(self.received[tag][r].sum()),
                      "messages": int(self.messages[tag][r].sum())} for tag in self.sent}
        return add_per_tag(*(b for a, z, b in self.bases if lo <= a and z <= hi), mine)

    def totals(self, rows: slice | None = None) -> tuple[int, int]:
        """(bytes sent, bytes received) by ``rows`` (all) since round 0."""
        sent, received = totals_of(self.per_tag(rows))
        return int(sent), int(received)

    def metrics(self, t: int, rows: slice) -> dict[str, float]:
        sent, received = self.totals(rows)
        return {"bytes_sent": float(sent), "bytes_received": float(received)}

    def state_dict(self) -> dict:
        return {"kind": "bytes", "rows": self.rows, "bases": [list(b) for b in self.bases],
                **{name: {k: v.tolist() for k, v in getattr(self, name).items()}
                   for name in ("sent", "received", "messages")}}

    def load_state_dict(self, state: dict) -> None:
        self._pending = {}
        if state.get("rows") is None:  # a coordinator's state: per-tag totals only
            self._sent, self._received, self._messages = {}, {}, {}
            self.bases = [(0, self.rows, dict(state["base"]))]
            return
        if state["rows"] != self.rows:
            raise ValidationError(f"a checkpoint's byte counts cover {state['rows']} rows, this run has {self.rows}")
        for name in ("sent", "received", "messages"):
            setattr(self, "_" + name, {k: np.asarray(v, dtype=np.int64) for k, v in state[name].items()})
        self.bases = [(int(a), int(z), dict(b)) for a, z, b in state.get("bases", [])]


def slice_state(state: dict, lo: int, hi: int) -> dict:
    """Rows lo … hi − 1 of a byte meter's state (one run of a stacked batch)."""
    out = {"kind": "bytes", "rows": hi - lo,
           "bases": [[a - lo, z - lo, b] for a, z, b in state.get("bases", []) if lo <= a and z <= hi]}
    for name in ("sent", "received", "messages"):
        out[name] = {k: v[lo:hi] for k, v in state[name].items()}
    return out


def as_rows(state: dict, rows: int) -> dict:
    """A byte state with per-row counts: a coordinator's (totals only) becomes zeros on ``rows`` rows carrying its
    totals as their base."""
    if state.get("rows") is not None:
        return state
    return {"kind": "bytes", "rows": rows, "bases": [[0, rows, dict(state["base"])]], "sent": {}, "received": {},
            "messages": {}}


def join_states(states: list[dict]) -> dict:
    """Byte meter states of consecutive rows joined (the runs of a stacked batch, resumed together); every tag
    any of them has."""
    tags = list(dict.fromkeys(tag for s in states for tag in s["sent"]))
    out = {"kind": "bytes", "rows": sum(s["rows"] for s in states), "bases": []}
    offset = 0
    for s in states:
        out["bases"] += [[a + offset, z + offset, b] for a, z, b in s.get("bases", [])]
        offset += s["rows"]
    for name in ("sent", "received", "messages"):
        out[name] = {k: sum((list(s[name].get(k, [0] * s["rows"])) for s in states), []) for k in tags}
    return out


def is_bytes_state(state: object) -> bool:
    return isinstance(state, dict) and state.get("kind") == "bytes"


def per_tag_of_state(state: dict) -> dict:
    """The per-tag totals a byte meter's (or a coordinator's) state stands for."""
    rows = {tag: {"bytes_sent": int(sum(state["sent"][tag])), "bytes_received": int(sum(state["received"][tag])),
                  "messages": int(sum(state["messages"][tag]))} for tag in state.get("sent", {})}
    return add_per_tag(state.get("base", {}), *(b for _, _, b in state.get("bases", [])), rows)


class ReplayComm(Comm):
    """Agent ``agent``'s view of a recorded run: every transmission returns, for this agent, the payloads it received
    in ``transcript`` (the k-th call here replays the k-th recorded call, whose tag must match), and NaN for every
    other row. ``comm`` supplies the edges (the agent's own incoming edges and weights)."""

    def __init__(self, transcript: Transcript, comm: Comm, agent: int) -> None:
        super().__init__(comm.edges, groups=comm.groups)
        if not 0 <= agent < comm.rows:
            raise ValidationError(f"agent {agent} is not a row of this comm (0..{comm.rows - 1})")
        self.agent, self._queue = int(agent), list(transcript.messages)
        self._mine = (self.edges.dst == self.agent).nonzero(as_tuple=True)[0]  # canonical order

    def _next(self, tag: str) -> Message:
        if not self._queue:
            raise ValidationError(f"the transcript has no message left for a call with tag {tag!r}")
        m = self._queue.pop(0)
        if m.tag != tag:
            raise ValidationError(f"replay out of step: call with tag {tag!r} where the transcript has {m.tag!r}")
        return m

    def _edge_payload(self, tag: str) -> torch.Tensor:
        m = self._next(tag)
        if not (torch.equal(m.src, self.edges.src) and torch.equal(m.dst, self.edges.dst)):
            raise ValidationError(f"recorded message {tag!r} is not one value per edge of this network")
        return m.payload

    def _nan(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        return torch.full(shape, math.nan, dtype=like.dtype, device=like.device)

    def _combine(self, x: torch.Tensor, tag: str, weighted: bool) -> torch.Tensor:
        payload = self._edge_payload(tag)
        out = self._nan(tuple(x.shape), x)
        i = self.agent
        acc = self.edges.self_weight[i].to(x.dtype) * x[i] if weighted else torch.zeros_like(x[i])
        for e in self._mine.tolist():
            term = self.edges.weight[e].to(x.dtype) * payload[e] if weighted else payload[e]
            acc = acc + term
        out[i] = acc
        return out

    def _mix(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - mix is overridden
        raise NotImplementedError

    def mix(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self._combine(x, tag, weighted=True)

    def neighbour_sum(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self._combine(x, tag, weighted=False)

    def average_in_place(self, x: torch.Tensor, *, tag: str, offset: torch.Tensor | None = None) -> torch.Tensor:
        """The agent's turn in the authors' sweep (:meth:`Comm.average_in_place`): the recorded call is one message
        per agent position k = 0, 1, … (agent k of every system reading its neighbours' current values); the agent
        takes, from the message of its own position, exactly the values it read, and averages them with its own
        value as the sweep does (the same kernel on its row: bit for bit), adding its ``offset``. Every other row is
        NaN."""
        n = self.rows // self.groups
        own = self.agent % n
        e = self.edges
        out = self._nan(tuple(x.shape), x)
        for k in range(n):
            m = self._next(tag)
            if k != own:
                continue
            idx = torch.nonzero(e.dst % n == k).reshape(-1)
            if not (torch.equal(m.src, e.src[idx]) and torch.equal(m.dst, e.dst[idx])):
                raise ValidationError(f"recorded message {tag!r} is not agent {k}'s reads in an in-place sweep of "
                                      f"this network")
            mine = (m.dst == self.agent).nonzero(as_tuple=True)[0]
            row = x[self.agent:self.agent + 1].reshape(1, -1)
            values = m.payload[mine].reshape(len(mine), -1).to(row.dtype)
            share = 1.0 / (self.degree[self.agent:self.agent + 1].to(row.dtype) + 1.0)
            total = row.index_add(0, torch.zeros(len(mine), dtype=torch.long, device=row.device), values) * share
            if offset is not None:
                total = total + offset[self.agent:self.agent + 1].reshape(1, -1)
            out[self.agent] = total.reshape(x.shape[1:])
        return out

    def _per_edge(self, tag: str, like: torch.Tensor) -> torch.Tensor:
        payload = self._edge_payload(tag)
        out = self._nan((len(self.edges), *payload.shape[1:]), like)
        out[self._mine] = payload[self._mine]
        return out

    def pull(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self._per_edge(tag, x)

    def push(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self._per_edge(tag, per_edge)

    def send(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self._per_edge(tag, per_edge)

    def average(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._next(tag)  # the agents' uploads
        down = self._next(tag)
        if not bool((down.src == SERVER).all()):
            raise ValidationError(f"replay out of step: {tag!r} is not the aggregator's reply")
        out = self._nan(tuple(x.shape), x)
        out[self.agent] = down.payload[(down.dst == self.agent).nonzero(as_tuple=True)[0][0]]
        return out


__all__ = ["ByteCounter", "Message", "ReplayComm", "Transcript"]
