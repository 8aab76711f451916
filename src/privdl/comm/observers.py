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


class AgentBytes:
    """Payload bytes each agent sends and receives, per tag: what :class:`ByteCounter` counts, split by agent and
    computed from shapes alone (a Comm calls :meth:`count` when this is its ``meter``; no payload is gathered, so
    it costs one small addition per call). A message is one (sender, receiver) pair carrying one row of the
    payload; the aggregator of ``average`` (``SERVER``) is not an agent. ``held`` (a slice): count only the ends
    of these agents — the slices' counts then add up to the network's. ``metrics(t, rows)`` gives the recorder
    ``bytes_sent`` / ``bytes_received`` (all rows' totals since the start of the run) at recorded rounds."""

    def __init__(self, rows: int, held: np.ndarray | None = None) -> None:
        self.rows = int(rows)
        self.held = np.ones(self.rows, dtype=bool) if held is None else np.asarray(held, dtype=bool)
        self.sent: dict[str, np.ndarray] = {}
        self.received: dict[str, np.ndarray] = {}
        self.messages: dict[str, int] = defaultdict(int)
        self.base = np.zeros(2, dtype=np.int64)  # totals before a resume from a checkpoint that kept only totals
        self._ends: dict[tuple[int, int], tuple] = {}

    def _degrees(self, src: torch.Tensor, dst: torch.Tensor) -> tuple[np.ndarray, np.ndarray, int]:
        key = (id(src), id(dst))
        hit = self._ends.get(key)
        if hit is None or hit[0] is not src or hit[1] is not dst:
            s, d = src.detach().cpu().long().numpy(), dst.detach().cpu().long().numpy()
            out = np.bincount(s[s >= 0], minlength=self.rows) * self.held
            into = np.bincount(d[d >= 0], minlength=self.rows) * self.held
            counted = int(self.held[np.where(s >= 0, s, d)].sum())  # once, at the sender (aggregator's: receiver)
            if len(self._ends) > 256:
                self._ends.clear()
            hit = self._ends[key] = (src, dst, out, into, counted)
        return hit[2], hit[3], hit[4]

    def count(self, tag: str, src: torch.Tensor, dst: torch.Tensor, width: int) -> None:
        """One call of ``tag``: message k from src[k] to dst[k], each ``width`` bytes."""
        out, into, counted = self._degrees(src, dst)
        if tag not in self.sent:
            self.sent[tag] = np.zeros(self.rows, dtype=np.int64)
            self.received[tag] = np.zeros(self.rows, dtype=np.int64)
        self.sent[tag] += out * width
        self.received[tag] += into * width
        self.messages[tag] += counted

    def totals(self, rows: slice | None = None) -> tuple[int, int]:
        """(bytes sent, bytes received) by ``rows`` (all) over every tag."""
        rows = slice(None) if rows is None else rows
        return (int(sum(v[rows].sum() for v in self.sent.values())),
                int(sum(v[rows].sum() for v in self.received.values())))

    def metrics(self, t: int, rows: slice) -> dict[str, float]:
        sent, received = self.totals(rows)
        return {"bytes_sent": float(sent + self.base[0]), "bytes_received": float(received + self.base[1])}

    def per_tag(self) -> dict[str, dict[str, int]]:
        """Bytes and messages per tag (the network's, or the held agents' ends)."""
        return {tag: {"bytes_sent": int(self.sent[tag].sum()), "bytes_received": int(self.received[tag].sum()),
                      "messages": int(self.messages[tag])} for tag in self.sent}

    def state_dict(self) -> dict:
        """Per agent and tag, and the totals (what a sliced run's checkpoint keeps: either resumes the other)."""
        return {"sent": {k: v.tolist() for k, v in self.sent.items()},
                "received": {k: v.tolist() for k, v in self.received.items()}, "messages": dict(self.messages),
                "totals": (self.base + np.asarray(self.totals())).tolist()}

    def load_state_dict(self, state: dict) -> None:
        if "sent" not in state:  # a sliced run's checkpoint: the network's totals only
            self.sent, self.received, self.messages = {}, {}, defaultdict(int)
            self.base = np.asarray(state["totals"], dtype=np.int64)
            return
        self.base = np.zeros(2, dtype=np.int64)
        self.sent = {k: np.asarray(v, dtype=np.int64) for k, v in state["sent"].items()}
        self.received = {k: np.asarray(v, dtype=np.int64) for k, v in state["received"].items()}
        self.messages = defaultdict(int, state["messages"])


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
