"""The slices' transport over torch.distributed: one process per slice, neighbour-only point-to-point on gloo.

The same three operations as the in-process :class:`privdl.comm.transport.Transport` — ``send``, ``recv``,
``agree_max`` — plus ``flush``, so :class:`privdl.comm.sliced.SliceComm` (and every algorithm and mechanism
above it) runs unchanged, and the same ``gather`` (every process's tensor at process 0, over ``send`` / ``recv``),
so the one :class:`privdl.simulator.coordinator.Coordinator` serves threads and processes alike
(../shared/RUNTIME.md, facts 1–6):

* every message is one gloo operation: a fixed-size header (round, tag, sequence, dtype, shape) and the payload in
  one buffer, received into a buffer of the size the receiver expects and checked against the expected header —
  gloo checks neither sizes nor dtypes and would fill a wrong-sized buffer or reinterpret the bytes (a message
  longer than the buffer makes gloo abort the receiving process, which its peers and the launcher then name);
* sends are posted asynchronously in the Comm's canonical order and all waited on before the Comm call returns
  (``flush``): no request outlives a call; receives are posted in the mirrored order;
* ``agree_max`` is one ``all_reduce(MAX)`` of one integer (key agreement's setup only: nothing collective runs
  in the round loop);
* a receive that fails — the peer died ("Connection closed") or did not answer within the process group's timeout —
  is an error naming the peer's agents, the round, the tag and the message;
* process 0's decisions (which run comes next, the round to resume from) reach the others as int64 broadcasts of a
  length both ends know (:func:`broadcast_ints`): nothing that crosses the network is ever unpickled (no
  ``*_object`` collective anywhere: ``tests/test_processes.py`` scans for them and runs workers where they raise).
"""

from __future__ import annotations

import contextlib
import functools
import zlib

import numpy as np
import torch
import torch.distributed as dist

from privdl.comm.transport import DTYPES, DTYPE_CODE as _CODE, TransportError, kind_of

HEADER = 16  # int64 entries: round, crc32(tag), sequence, dtype code, ndim, shape (≤ 11 dims)


def _header_array(header: tuple) -> np.ndarray:
    """The header's int64 entries (numpy: a message's header is built and checked several times per round, and a
    small numpy array costs a tenth of a torch tensor's construction)."""
    t, tag, seq, dtype, shape = header
    if len(shape) > HEADER - 5:
        raise TransportError(f"a payload of {len(shape)} dimensions does not fit the header")
    values = [int(t), _crc(tag), int(seq), _CODE[dtype], len(shape), *(int(s) for s in shape)]
    return np.array(values + [-1] * (HEADER - len(values)), dtype=np.int64)


def encode(header: tuple) -> torch.Tensor:
    """The header (round, tag, sequence, dtype, shape) as the :data:`HEADER` int64 entries that lead a message."""
    return torch.from_numpy(_header_array(header))


def failure(exc: BaseException) -> tuple[str, str]:
    """What a gloo error says happened — "died" (the peer's connection closed or was reset), "timeout" (nothing
    within the process group's timeout) or "failed" — and its first line (at most 200 characters)."""
    text = str(exc)
    low = text.lower()
    kind = "died" if "closed" in low or "reset" in low else "timeout" if "timed out" in low or "timeout" in low \
        else "failed"
    return kind, (text.splitlines()[0][:200] if text else type(exc).__name__)


@functools.lru_cache(maxsize=1024)
def _crc(tag: str) -> int:
    return zlib.crc32(tag.encode())


#: the dtypes whose CPU tensors :meth:`Staging.message` copies through numpy (all of DTYPES but bfloat16)
_NUMPY = frozenset(d for d in DTYPES if d is not torch.bfloat16)
#: each of those dtypes' numpy dtype (:meth:`Staging.payload`'s view of received bytes)
_AS_NUMPY = {d: torch.empty(0, dtype=d).numpy().dtype for d in _NUMPY}


class Staging:
    """How a process's messages cross gloo, which moves CPU tensors only (a GPU tensor given to gloo fails:
    "writev … Bad address", ../shared/RUNTIME.md fact 8): every message is built in a CPU buffer — page-locked
    (pinned) when the process computes on a GPU, so the copies off and onto the device are DMA transfers, and taken
    from torch's caching host allocator, so a round reuses the last round's buffers — and a received *payload*
    (the agents' rows and per-edge values) is copied onto the process's ``device``; control and setup messages
    (the coordinator's scalars and counts, key agreement's bytes) stay on the CPU, where their readers use them.
    On the CPU (``device`` "cpu") the same code runs and moves nothing. ``sent`` / ``received``: bytes copied off /
    onto the device (payload only; 0 on the CPU)."""

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device or "cpu")
        self.pin = self.device.type == "cuda"
        self.sent = self.received = 0

    @property
    def device(self) -> torch.device:
        """Where the process computes (received payloads go there)."""
        return self._device

    @device.setter
    def device(self, device: torch.device | str) -> None:
        self._device = torch.device(device)
        self._cpu = self._device.type == "cpu"  # (read per message: a torch.device's .type is not free)

    def buffer(self, size: int) -> torch.Tensor:
        """A CPU byte buffer for one message (pinned on a GPU process)."""
        return torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)

    def buffers(self, size: int) -> tuple[torch.Tensor, np.ndarray]:
        """:meth:`buffer` and its numpy view (without pinning: numpy's array and torch's view of it, one torch call
        instead of two)."""
        if self.pin:
            out = self.buffer(size)
            return out, out.numpy()
        view = np.empty(size, dtype=np.uint8)
        return torch.from_numpy(view), view

    def message(self, header: torch.Tensor | np.ndarray, payload: torch.Tensor) -> torch.Tensor:
        """The header's and the payload's bytes in one CPU buffer (one copy: off the device where the payload is
        on one, and back to the caller only after the copy is complete — gloo reads the buffer right away).
        ``header``: its :data:`HEADER` int64 entries (a tensor, or a numpy array: written without a torch call)."""
        value = payload.detach()
        size = value.numel() * value.element_size()
        out, view = self.buffers(HEADER * 8 + size)
        view[:HEADER * 8] = (header.numpy() if isinstance(header, torch.Tensor) else header).view(np.uint8)
        self.fill(out, view, value)
        return out

    def fill(self, out: torch.Tensor, view: np.ndarray, value: torch.Tensor) -> None:
        """Write ``value``'s bytes after the header of the message buffer ``out`` (``view``: its numpy view), which
        has exactly their size: :meth:`message`'s copy, into a buffer made earlier (a sender's buffer is reused
        once its last send completed: :meth:`DistTransport.send`)."""
        if view.size > HEADER * 8:
            cpu = value.is_cpu  # (no device object: .device makes one per call)
            if cpu and value.dtype in _NUMPY:  # numpy's copy: no torch call on the CPU
                view[HEADER * 8:] = (value.detach() if value.requires_grad else value).numpy().reshape(-1) \
                    .view(np.uint8)
            else:  # (bfloat16 has no numpy dtype; a device's values are copied off it by torch)
                out[HEADER * 8:].view(value.dtype).copy_(value.detach().reshape(-1))
            if not cpu:
                self.sent += view.size - HEADER * 8

    def stays(self, kind: str) -> bool:
        """Whether a received message of ``kind`` stays on the CPU (control and setup, or any on a CPU process)."""
        return self._cpu or kind != "payload"

    def payload(self, data: torch.Tensor | np.ndarray, dtype: torch.dtype, shape: tuple, kind: str) -> torch.Tensor:
        """A received message's payload bytes ``data`` (CPU) as a tensor of ``dtype`` and ``shape``: on the device
        for a payload (``kind``), on the CPU for control and setup. ``data`` is a uint8 tensor, or — for a message
        that stays on the CPU (:meth:`stays`) — a numpy view of the bytes: then the tensor is numpy's view of them
        (one torch call, not a slice, a view and a reshape; a device's copy needs the buffer's own tensor, whose
        page-locked block torch's host allocator keeps until the copy is done)."""
        if isinstance(data, np.ndarray):
            like = _AS_NUMPY.get(dtype)
            if like is not None and self.stays(kind):
                return torch.from_numpy(data.view(like).reshape(shape))
            data = torch.from_numpy(data)
        value = data.view(dtype).reshape(shape)
        if kind == "payload" and not self._cpu:
            self.received += data.numel()
            # from pinned memory the copy is asynchronous; torch's host allocator keeps the buffer until it is done,
            # and the device's kernels after it run on the same stream
            return value.to(self.device, non_blocking=True)
        return value


class DistTransport:
    """Slice ``rank`` of ``world`` over the default (gloo) process group; ``agents[r]`` are slice r's agents (for
    messages naming who failed); ``device``: where the process computes (its payloads staged through the CPU:
    :class:`Staging`)."""

    def __init__(self, rank: int, world: int, agents: list[tuple[int, ...]], *, timeout: float,
                 device: torch.device | str | None = None) -> None:
        self.rank, self.parts, self.agents, self.timeout = int(rank), int(world), agents, float(timeout)
        self.staging = Staging(device)
        self._pending: list = []
        self._tags: dict[int, str] = {}
        #: per (tag, dtype, shape): the header's entries with round and sequence 0, the payload's bytes, its dtype
        #: and kind (what every message of a round's calls repeats: :meth:`_head`)
        self._heads: dict[tuple, tuple] = {}
        #: per (receiver, tag, dtype, shape): a send buffer not in flight, its numpy view, its header's int64
        #: entries (a view), the payload's dtype, shape, bytes and kind (:meth:`send`)
        self._outgoing: dict[tuple, tuple] = {}
        self.payload_bytes = torch.zeros(world, dtype=torch.int64)  # sent by this process, per receiver
        self._payload = self.payload_bytes.numpy()  # the same memory: counted without a torch call per message
        self.header_bytes = 0
        self.setup_bytes = 0
        self.control_bytes = 0  # the coordinator's gathers and the wire for observers
        #: control bytes this process received (headers included), per round: what process 0 takes in on a
        #: recorded round (placement.control_bytes_received in the manifest)
        self.control_received: dict[int, int] = {}
        self.tap = None  # tests: called with the bytes of every header and payload sent
        self.control_messages = 0
        self.failed = None

    def _who(self, part: int) -> str:
        a = list(self.agents[part])
        return f"process {part} (agent{'s' if len(a) > 1 else ''} {', '.join(map(str, a[:8]))}" + \
            (" …)" if len(a) > 8 else ")")

    def _describe(self, header: tuple) -> str:
        t, tag, seq, dtype, shape = header
        return f"round {t}, tag {tag!r}, message {seq} ({dtype}, shape {tuple(shape)})"

    def _decode(self, h: torch.Tensor) -> str:
        v = h.tolist()
        tag = self._tags.get(v[1], f"crc32 {v[1]}")
        dtype = str(DTYPES[v[3]]) if 0 <= v[3] < len(DTYPES) else f"code {v[3]}"
        shape = tuple(v[5:5 + v[4]]) if 0 <= v[4] <= HEADER - 5 else "?"
        return f"round {v[0]}, tag {tag!r}, message {v[2]} ({dtype}, shape {shape})"

    def fail(self, part: int, error: BaseException) -> None:
        self.failed = (part, error)

    HEADS = 4096  # (tag, dtype, shape) entries :meth:`_head` keeps (a run has a few; a bound against a leak)

    def _head(self, header: tuple) -> tuple[np.ndarray, int, torch.dtype, str]:
        """``header``'s int64 entries (a new array: :func:`_header_array`'s), the payload's size in bytes, its dtype
        and its kind (:func:`privdl.comm.transport.kind_of`). The part of a header that is fixed per tag, dtype and
        shape is made once (and the tag's crc32 registered for error messages); each call copies it and writes the
        round and the sequence number — a round of a small model sends and checks a few headers."""
        t, tag, seq, dtype, shape = header
        fixed = self._heads.get((tag, dtype, shape))
        if fixed is None:
            base = _header_array((0, tag, 0, dtype, shape))
            self._tags[int(base[1])] = tag
            size = DTYPES[_CODE[dtype]].itemsize
            for s in shape:
                size *= int(s)
            if len(self._heads) >= self.HEADS:
                self._heads.clear()
            fixed = self._heads[(tag, dtype, tuple(shape))] = (base, size, DTYPES[_CODE[dtype]], kind_of(tag))
        out = fixed[0].copy()
        out[0], out[2] = t, seq
        return out, fixed[1], fixed[2], fixed[3]

    OUTGOING = 1024  # send buffers :meth:`send` keeps for reuse (a run has a few; a bound against a leak)

    def send(self, src: int, dst: int, header: tuple, payload: torch.Tensor) -> None:
        """Post one message to ``dst``: the header and the payload in one buffer (one gloo operation). The buffer
        of a (receiver, tag, dtype, shape) is made once, with the header's fixed part written, and reused by the
        next such send after this one completed (:meth:`flush` hands it back): each send writes the round, the
        sequence number and the payload's bytes into it (a payload whose dtype or shape is not the header's gets a
        buffer of its own, as before)."""
        t, tag, seq, dtype, shape = header
        key = (dst, tag, dtype, shape)
        slot = self._outgoing.pop(key, None)
        if slot is None or payload.dtype is not slot[3] or payload.shape != slot[4]:
            if slot is not None:  # (a mismatched payload: its own buffer, the kept one stays)
                self._outgoing[key] = slot
            head, size, want, kind = self._head(header)
            if slot is None and payload.dtype is want and payload.numel() * payload.element_size() == size:
                message, view = self.staging.buffers(HEADER * 8 + size)
                view[:HEADER * 8] = head.view(np.uint8)
                slot = (message, view, view[:HEADER * 8].view(np.int64), want, payload.shape, size, kind)
            else:
                key = slot = None
                message = self.staging.message(head, payload)
                size = payload.numel() * payload.element_size()
        if slot is not None:
            message, view, entries, _, _, size, kind = slot
            entries[0], entries[2] = t, seq
            self.staging.fill(message, view, payload)  # gloo sends CPU tensors: GPU values staged here
        try:  # (no context manager: one per message is measurable in a round of 0.2 ms)
            work = dist.isend(message, dst)
        except RuntimeError as exc:
            self._raise(exc, dst, header, "sending")
        self._pending.append((work, message, dst, header, key, slot))  # the buffer kept until waited
        if kind == "payload":
            self._payload[dst] += size
        elif kind == "setup":
            self.setup_bytes += size
        else:
            self.control_bytes += size
        if self.tap is not None:
            self.tap(message.numpy().tobytes())
        self.header_bytes += HEADER * 8

    def _wait(self, work, peer: int, header: tuple, what: str) -> None:
        try:
            work.wait()
        except RuntimeError as exc:
            self._raise(exc, peer, header, what)

    def _raise(self, exc: RuntimeError, peer: int, header: tuple, what: str):
        """gloo's error ``exc`` while posting or waiting on a message to or from ``peer`` as a
        :class:`TransportError` naming both processes, the message and whether the peer died or did not answer in
        time (posting fails too once a pair's connection broke)."""
        kind, text = failure(exc)
        said = {"died": "died (its connection closed)", "timeout": f"did not answer within {self.timeout:g} s",
                "failed": "failed"}[kind]
        raise TransportError(f"{self._who(self.rank)}: {self._who(peer)} {said} while {what} "
                             f"{self._describe(header)} ({text})") from None

    def _post(self, src: int, header: tuple):
        """Post the receive of one message from ``src`` of the size ``header`` announces (the receiver knows every
        message's shape and dtype in advance: the Comm's static plan, the coordinator's shapes)."""
        head, size, dtype, kind = self._head(header)
        buffer, view = self.staging.buffers(HEADER * 8 + size)
        view[:HEADER * 8] = 0
        try:
            return src, (header, head, dtype, kind, view), buffer, dist.irecv(buffer, src)
        except RuntimeError as exc:
            self._raise(exc, src, header, "waiting for")

    def _take(self, dst: int, posted) -> torch.Tensor:
        """Wait for a posted message and check its header against the expected one: a message with another round,
        tag, sequence, dtype or shape is an error naming both (a shorter message, too: its header says so). A
        message *longer* than expected never arrives here — gloo aborts the receiving process ("Received data size
        doesn't match expected size"), and its peers and the launcher then name the process that died."""
        src, (header, head, dtype, kind, view), buffer, work = posted
        self._wait(work, src, header, "waiting for")
        if view[:HEADER * 8].tobytes() != head.tobytes():
            raise TransportError(f"{self._who(dst)} expected {self._describe(header)} from {self._who(src)}, "
                                 f"received {self._decode(buffer[:HEADER * 8].view(torch.int64))}")
        if kind == "control":
            t = int(header[0])
            self.control_received[t] = self.control_received.get(t, 0) + int(buffer.numel())
        staging = self.staging
        return staging.payload(view[HEADER * 8:] if staging.stays(kind) else buffer[HEADER * 8:], dtype,
                               tuple(header[4]), kind)

    def recv(self, src: int, dst: int, header: tuple) -> torch.Tensor:
        return self._take(dst, self._post(src, header))

    def exchange(self, part: int, sends: list[tuple[int, tuple, torch.Tensor]],
                 recvs: list[tuple[int, tuple]]) -> dict[int, torch.Tensor]:
        """One Comm call's messages, one gloo operation each: every receive posted (of the size its expected
        header announces), every send posted, then every receive waited on and its header checked, then every
        send. The peers' latencies overlap. Returns the payloads by sender."""
        posted = [self._post(src, header) for src, header in recvs]
        for dst, header, value in sends:
            self.send(part, dst, header, value)
        out = {p[0]: self._take(part, p) for p in posted}
        self.flush(part)
        return out

    def flush(self, part: int) -> None:
        """Wait for every posted send; each reusable buffer goes back to :meth:`send`'s store once its send is
        complete (gloo no longer reads it)."""
        pending, self._pending = self._pending, []
        out = self._outgoing
        for work, _, dst, header, key, slot in pending:
            self._wait(work, dst, header, "sending")
            if slot is not None:
                if len(out) >= self.OUTGOING:
                    out.clear()
                out[key] = slot

    def gather(self, part: int, t: int, tag: str, value: torch.Tensor,
               shapes: list[tuple[int, ...]]) -> list[torch.Tensor] | None:
        """Every process's ``value`` of round ``t`` at process 0, in rank order (its own first; ``shapes[k]``: the
        shape process k sends), received one process at a time; the others send theirs (control bytes) and get
        None. The coordinator's operation (:class:`privdl.simulator.coordinator.Coordinator`)."""
        if part:
            self.send(part, 0, (t, tag, -1, str(value.dtype), tuple(value.shape)), value)
            self.flush(part)
            return None
        return [value] + [self.recv(k, 0, (t, tag, -1, str(value.dtype), tuple(shapes[k])))
                          for k in range(1, self.parts)]

    def agree_max(self, part: int, value: int) -> int:
        out = all_max(value, who=self._who(self.rank), what="agree on a value")
        self.control_messages += 1
        return out


#: what each kind of gloo failure (:func:`failure`) says about the processes of a collective
_WHY = {"died": "a process died", "timeout": "a process did not answer within the timeout",
        "failed": "a process failed"}


@contextlib.contextmanager
def _collective(message: str):
    """gloo's errors in a collective as a :class:`TransportError`: ``message``, why, and gloo's first line."""
    try:
        yield
    except RuntimeError as exc:
        kind, text = failure(exc)
        raise TransportError(f"{message}: {_WHY[kind]} ({text})") from None


def broadcast_ints(values: list[int] | None, length: int, *, src: int = 0, what: str = "a control message"
                   ) -> list[int]:
    """Process ``src``'s ``length`` integers, on every process: one int64 tensor broadcast (control data: decisions
    such as which run comes next or the round to resume from). Never an object collective — those pickle what
    they receive (``broadcast_object_list`` unpickles process 0's bytes: code execution for anyone who can pose as
    process 0) —, and never of a length the receiver does not know: the receiver's buffer is ``length`` integers."""
    rank = dist.get_rank()
    t = torch.full((length,), -1, dtype=torch.int64)
    if rank == src:
        if values is None or len(values) != length:
            raise ValueError(f"broadcast_ints: {length} integers expected, got {values!r}")
        t[:] = torch.tensor([int(v) for v in values], dtype=torch.int64)
    with _collective(f"process {rank}: {what} from process {src} was not received"):
        dist.broadcast(t, src=src)
    return t.tolist()


def broadcast_bytes(data: bytes | None, *, src: int = 0, what: str = "a control message") -> bytes:
    """Process ``src``'s ``data``, on every process: its length (:func:`broadcast_ints`), then the bytes — bytes
    only, for the receiver to parse as text (never to unpickle)."""
    rank = dist.get_rank()
    n = broadcast_ints([len(data)] if rank == src else None, 1, src=src, what=what)[0]
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if rank == src and n else \
        torch.zeros(n, dtype=torch.uint8)
    with _collective(f"process {rank}: {what} from process {src} was not received"):
        dist.broadcast(buffer, src=src)
    return bytes(buffer.tolist())


def all_max(value: int, *, who: str, what: str) -> int:
    """The largest ``value`` over every process (one int64 ``all_reduce(MAX)``: control data, outside the rounds);
    a failure names ``who`` and what the processes could not do."""
    t = torch.tensor([int(value)], dtype=torch.int64)
    with _collective(f"{who}: the processes could not {what}"):
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


__all__ = ["DistTransport", "HEADER", "Staging", "all_max", "broadcast_bytes", "broadcast_ints", "encode", "failure"]
