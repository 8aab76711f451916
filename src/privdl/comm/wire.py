"""The wire of a split run with observers: what the eavesdropper sees, reported as the simulator reports it.

Every slice reports the messages its held agents receive, and :class:`Wire` sends them to slice 0 over the
transport (threads and processes alike), which merges the parts of each call into one message in the simulator's
order and hands it to the observers.
"""

from __future__ import annotations

from typing import Sequence

import torch

from privdl.comm.base import Observer
from privdl.comm.transport import CONTROL, DTYPE_CODE, DTYPES, TransportError


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


__all__ = ["WIRE", "WIRE_META", "Wire"]
