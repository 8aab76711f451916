"""The slices' transport over torch.distributed: one process per slice, neighbour-only point-to-point on gloo.

The same three operations as the in-process :class:`privdl.comm.sliced.Transport` — ``send``, ``recv``,
``agree_max`` — plus ``flush``, so :class:`privdl.comm.sliced.SliceComm` (and every algorithm and mechanism
above it) runs unchanged, and the same ``gather`` (every process's tensor at process 0, over ``send`` / ``recv``),
so the one :class:`privdl.simulator.coordinator.Coordinator` serves threads and processes alike
(../shared/RUNTIME.md, facts 1–6):

* every payload is preceded by a fixed-size header (round, tag, sequence, dtype, shape) that the receiver compares
  with what it expects before it receives the payload — gloo checks neither sizes nor dtypes and would fill a
  wrong-sized buffer or reinterpret the bytes;
* sends are posted asynchronously in the Comm's canonical order and all waited on before the Comm call returns
  (``flush``): no request outlives a call; receives are posted in the mirrored order;
* ``agree_max`` is one ``all_reduce(MAX)`` of one integer (the padded lot length: control data, never a model);
* a receive that fails — the peer died ("Connection closed") or did not answer within the process group's timeout —
  is an error naming the peer's agents, the round, the tag and the message;
* process 0's decisions (which run comes next, the round to resume from) reach the others as int64 broadcasts of a
  length both ends know (:func:`broadcast_ints`): nothing that crosses the network is ever unpickled (no
  ``*_object`` collective anywhere: ``tests/test_processes.py`` scans for them and runs workers where they raise).
"""

from __future__ import annotations

import functools
import zlib

import torch
import torch.distributed as dist

from privdl.comm.sliced import TransportError, kind_of

HEADER = 16  # int64 entries: round, crc32(tag), sequence, dtype code, ndim, shape (≤ 11 dims)
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]
_CODE = {str(d): k for k, d in enumerate(DTYPES)}


def encode(header: tuple) -> torch.Tensor:
    t, tag, seq, dtype, shape = header
    if len(shape) > HEADER - 5:
        raise TransportError(f"a payload of {len(shape)} dimensions does not fit the header")
    values = [int(t), _crc(tag), int(seq), _CODE[dtype], len(shape), *(int(s) for s in shape)]
    return torch.tensor(values + [-1] * (HEADER - len(values)), dtype=torch.int64)


@functools.lru_cache(maxsize=1024)
def _crc(tag: str) -> int:
    return zlib.crc32(tag.encode())


class DistTransport:
    """Slice ``rank`` of ``world`` over the default (gloo) process group; ``agents[r]`` are slice r's agents (for
    messages naming who failed)."""

    def __init__(self, rank: int, world: int, agents: list[tuple[int, ...]], *, timeout: float) -> None:
        self.rank, self.parts, self.agents, self.timeout = int(rank), int(world), agents, float(timeout)
        self._pending: list = []
        self._tags: dict[int, str] = {}
        self.payload_bytes = torch.zeros(world, dtype=torch.int64)  # sent by this process, per receiver
        self.header_bytes = 0
        self.setup_bytes = 0
        self.control_bytes = 0  # the coordinator's gathers and the wire for observers
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

    def send(self, src: int, dst: int, header: tuple, payload: torch.Tensor) -> None:
        self._tags[_crc(header[1])] = header[1]
        value = payload.detach().to("cpu").contiguous()  # gloo sends CPU tensors: GPU values are staged here
        h = encode(header)
        self._pending += [(dist.isend(h, dst), h, value, dst, header), (dist.isend(value, dst), h, value, dst, header)]
        size, kind = value.numel() * value.element_size(), kind_of(header[1])
        if kind == "payload":
            self.payload_bytes[dst] += size
        elif kind == "setup":
            self.setup_bytes += size
        else:
            self.control_bytes += size
        if self.tap is not None:
            self.tap(h.numpy().tobytes() + value.numpy().tobytes())
        self.header_bytes += h.numel() * h.element_size()

    def _wait(self, work, peer: int, header: tuple, what: str) -> None:
        try:
            work.wait()
        except RuntimeError as exc:
            text = str(exc)
            kind = ("died (its connection closed)" if "closed" in text.lower() or "reset" in text.lower() else
                    f"did not answer within {self.timeout:g} s" if "timed out" in text.lower() or
                    "timeout" in text.lower() else "failed")
            raise TransportError(f"{self._who(self.rank)}: {self._who(peer)} {kind} while {what} "
                                 f"{self._describe(header)} ({text.splitlines()[0][:200]})") from None

    def recv(self, src: int, dst: int, header: tuple) -> torch.Tensor:
        self._tags[_crc(header[1])] = header[1]
        want = encode(header)
        got = torch.empty(HEADER, dtype=torch.int64)
        self._wait(dist.irecv(got, src), src, header, "waiting for")
        if not torch.equal(got, want):
            raise TransportError(f"{self._who(dst)} expected {self._describe(header)} from {self._who(src)}, "
                                 f"received {self._decode(got)}")
        _, _, _, dtype, shape = header
        value = torch.empty(tuple(shape), dtype=DTYPES[_CODE[dtype]])
        self._wait(dist.irecv(value, src), src, header, "receiving")
        return value

    def exchange(self, part: int, sends: list[tuple[int, tuple, torch.Tensor]],
                 recvs: list[tuple[int, tuple]]) -> dict[int, torch.Tensor]:
        """One Comm call's messages in two phases: every header receive posted, every send posted, every header
        waited on and checked; then every payload receive posted (each of the dtype and shape its checked header
        announced) and waited on. No payload receive is posted before its header is checked — gloo aborts the
        process when a message is larger than the posted buffer — and the peers' latencies overlap in each phase.
        Returns the payloads by sender."""
        headers = []
        for src, header in recvs:
            self._tags[_crc(header[1])] = header[1]
            got = torch.empty(HEADER, dtype=torch.int64)
            headers.append((src, header, got, dist.irecv(got, src)))
        for dst, header, value in sends:
            self.send(part, dst, header, value)
        for src, header, got, work in headers:
            self._wait(work, src, header, "waiting for")
            if not torch.equal(got, encode(header)):
                raise TransportError(f"{self._who(part)} expected {self._describe(header)} from {self._who(src)}, "
                                     f"received {self._decode(got)}")
        payloads = []
        for src, header, _, _ in headers:
            value = torch.empty(tuple(header[4]), dtype=DTYPES[_CODE[header[3]]])
            payloads.append((src, header, value, dist.irecv(value, src)))
        out = {}
        for src, header, value, work in payloads:
            self._wait(work, src, header, "receiving")
            out[src] = value
        self.flush(part)
        return out

    def flush(self, part: int) -> None:
        pending, self._pending = self._pending, []
        for work, _, _, dst, header in pending:
            self._wait(work, dst, header, "sending")

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
        t = torch.tensor([int(value)], dtype=torch.int64)
        try:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        except RuntimeError as exc:
            text = str(exc).splitlines()[0][:200]
            why = "a process died" if "closed" in text.lower() or "reset" in text.lower() else "a process failed"
            raise TransportError(f"{self._who(self.rank)}: the processes could not agree on a lot length: {why} "
                                 f"({text})") from None
        self.control_messages += 1
        return int(t)


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
    try:
        dist.broadcast(t, src=src)
    except RuntimeError as exc:
        text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        why = ("a process died" if "closed" in text.lower() or "reset" in text.lower() else
               "a process did not answer within the timeout" if "timed out" in text.lower() or
               "timeout" in text.lower() else "a process failed")
        raise TransportError(f"process {rank}: {what} from process {src} was not received: {why} ({text})") from None
    return t.tolist()


__all__ = ["DistTransport", "HEADER", "broadcast_ints", "encode"]
