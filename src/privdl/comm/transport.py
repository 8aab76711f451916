"""The transport that joins the slices of a split run in one process (threads), and what every transport shares.

What crosses between slices is exactly what would cross a process boundary: for each pair of slices and each call,
one tagged payload (the sender's rows or edges for that peer, in canonical order) with a header (round, tag,
sequence, dtype, shape) checked on receipt. :class:`Transport` is the in-process implementation (queues; payloads
are copied, never shared); the distributed runtime implements the same methods over torch.distributed
(:class:`privdl.runtime.transport.DistTransport`). Both count a message's bytes by its tag's kind (:func:`kind_of`:
setup, control or payload) and name its dtype by the codes of :data:`DTYPES`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Sequence

import numpy as np
import torch

from privdl.errors import PrivdlError


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


__all__ = ["CONTROL", "DTYPES", "DTYPE_CODE", "SETUP", "Transport", "TransportError", "kind_of"]
