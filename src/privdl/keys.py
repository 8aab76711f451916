"""Keys: every random draw of a run is keyed by (purpose, counter, agent[, neighbour]) or by a shared key that only
its holders know (DESIGN.md, "randomness").

Two layers:

* a **key source** says which 64-bit key a draw uses: :meth:`KeySource.own` for a draw that one agent makes alone
  (its mini-batch, its lot, its private noise; optionally qualified by a neighbour, e.g. a cross-gradient for that
  neighbour) and :meth:`KeySource.shared` for a draw that exactly a set of holders can make (DECOR's canceling term
  of an edge, a Whisper / HBC seed group). :class:`RootKeys` derives every key from the run's root seed, so a run
  is reproducible and the simulator can replay any agent alone; a deployment plugs in keys agreed pairwise
  (the runtime issue) without touching any mechanism.
* a **counter-based generator** turns a key and a counter (the round or the noisy access) into numbers:
  ``bits(fold(key, counter), size)`` is the SplitMix64 stream of the folded key (Steele, Lea, Flood 2014;
  Vigna's reference constants), uniforms take its top 53 bits, normals are Φ⁻¹ of those uniforms (SciPy's, the same
  on every CPU: :func:`inverse_normal`) — or, for rows of
  at least ``WIDE`` numbers (model-sized noise), numpy's Philox4x64 keyed by the same key. Every function is
  vectorised over keys, so the draws of all agents (and all replicas of a sweep) are one array operation, and an
  agent's numbers depend only on its own key and the element index: never on n, on another agent's data size, or
  on how the rows are split over processes.

Speed against ``torch.randn`` from one (unkeyed) generator: BENCHMARKS.md, "keyed draws".

**256-bit keys** (:data:`KEY256`, the keys of runs with agreed keys, :mod:`privdl.agreement`): a key is then
one numpy element of 32 random bytes instead of a uint64, and the same functions take either — the kind of the key
decides the generator, so an agreed run cannot draw from a 64-bit key by accident. A 256-bit key is qualified
(requester, counter) one way, with BLAKE2b-256 keyed by the key (a PRF: :func:`fold`), and its draws are the
ChaCha20 keystream keyed by the qualified key itself (word j of a row at stream position j, the 64-byte block
counter in the nonce: :func:`stream`). Uniforms and normals are made from those words exactly as from SplitMix64's
(top 53 bits; Φ⁻¹ for every row length), integers as ⌊u·high⌋ (bias ≤ high·2⁻⁵³). Nothing along that path has fewer
than 256 bits: an observed draw gives away neither its key nor any other draw's, and no search smaller than 2²⁵⁶
finds one. SplitMix64 and the counter fold of 64-bit keys are bijections — one observed number gives its key away —
which is why root keys (public anyway: the root seed is in the config) are the only ones that use them.

:data:`DRAWN` counts the numbers drawn by each generator in this process (``chacha20``, ``splitmix64``,
``philox``): a run's manifest states them, and an agreed run's must show only ChaCha20.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch

from privdl.errors import ValidationError

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment (2^64 / φ)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1
#: a 256-bit key: 32 raw bytes as one numpy element (agreed runs); 64-bit keys are uint64
KEY256 = np.dtype("V32")
#: numbers drawn in this process, per generator (a run's manifest states the difference over the run)
DRAWN: dict[str, int] = {"chacha20": 0, "splitmix64": 0, "philox": 0}
_DRAWN_LOCK = threading.Lock()


def _count(generator: str, numbers: int) -> None:
    with _DRAWN_LOCK:
        DRAWN[generator] += int(numbers)


def drawn() -> dict[str, int]:
    """A copy of :data:`DRAWN` (take one before and after a run: the difference is the run's)."""
    with _DRAWN_LOCK:
        return dict(DRAWN)


def key256(secret: bytes) -> np.void:
    """A 256-bit key from 32 bytes."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) != 32:
        raise ValidationError(f"a 256-bit key needs 32 bytes, got {type(secret).__name__} of length "
                              f"{len(secret) if hasattr(secret, '__len__') else '?'}")
    return np.void(bytes(secret))


def is_wide(keys: object) -> bool:
    """Whether ``keys`` (an array or one key) are 256-bit keys."""
    return np.asarray(keys).dtype == KEY256


def as_keys(values: object) -> np.ndarray:
    """An array of keys from a sequence of keys: 256-bit ones (``np.void``) or integers (64-bit; numpy would turn a
    list mixing integers above and below 2⁶³ into floats). An empty sequence gives an empty uint64 array."""
    if isinstance(values, np.ndarray):
        return values if values.dtype == KEY256 else _u64(values)
    values = list(values)  # type: ignore[call-overload]
    if values and all(isinstance(v, np.void) for v in values):
        return np.array(values, dtype=KEY256)
    return np.array([int(v) for v in values], dtype=np.uint64)


def key_dtype(source: object) -> np.dtype:
    """The kind of key a key source gives (``key_dtype``: uint64 unless it says 256-bit)."""
    return np.dtype(getattr(source, "key_dtype", np.uint64))


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on uint64 values (a bijection of 64-bit integers), vectorised; modifies and
    returns ``z`` (a uint64 array)."""
    t = np.empty_like(z)
    with np.errstate(over="ignore"):  # arithmetic modulo 2^64 is the point (0-d arrays would warn)
        np.right_shift(z, 30, out=t)
        z ^= t
        z *= _M1
        np.right_shift(z, 27, out=t)
        z ^= t
        z *= _M2
        np.right_shift(z, 31, out=t)
        z ^= t
    return z


def _mix_int(z: int) -> int:
    """:func:`mix64` of one Python integer (same numbers, no array overhead)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def fold_int(key: int, value: int) -> int:
    """:func:`fold` of one key and one value, on Python integers."""
    return _mix_int(key ^ _mix_int(((value + 1) * 0x9E3779B97F4A7C15) & _MASK))


def _u64(values: object) -> np.ndarray:
    """A uint64 array of ``values`` (Python ints, or integer arrays; negatives are refused)."""
    arr = np.asarray(values)
    if arr.dtype == np.uint64:
        return arr.copy()
    if arr.dtype.kind not in "iu":
        raise ValidationError(f"keys and counters must be integers, got dtype {arr.dtype}")
    if arr.size and int(arr.min()) < 0:
        raise ValidationError("keys and counters must be >= 0")
    return arr.astype(np.uint64)


def fold(keys: np.ndarray | int, values: np.ndarray | int) -> np.ndarray:
    """One key per (key, value) pair, broadcasting; used to qualify a key by an agent, a neighbour or a counter.
    64-bit keys: k' = mix(k ⊕ mix((v + 1)·γ)) (a bijection, fast). 256-bit keys: k' = BLAKE2b-256 keyed by k of
    v's 8 bytes (one way: a key found for one draw leads to no other)."""
    karr = np.asarray(keys)
    if karr.dtype == KEY256:
        return _fold256(karr, values)
    k = np.atleast_1d(_u64(keys)) if np.ndim(keys) == 0 and np.ndim(values) > 0 else _u64(keys)
    with np.errstate(over="ignore"):
        v = (_u64(values) + np.uint64(1)) * GOLDEN
    return mix64(np.bitwise_xor(k, mix64(v)))


#: ChaCha20's constant words ("expand 32-byte k")
_SIGMA = np.frombuffer(b"expand 32-byte k", dtype="<u4")
def _rotl(x: np.ndarray, n: int, tmp: np.ndarray) -> None:
    np.right_shift(x, 32 - n, out=tmp)
    np.left_shift(x, n, out=x)
    np.bitwise_or(x, tmp, out=x)


def chacha20_blocks(keys: np.ndarray, counters: np.ndarray, nonces: np.ndarray) -> np.ndarray:
    """ChaCha20's block function (RFC 7539 §2.3), vectorised: block i of key ``keys[i]`` (256-bit keys), 32-bit
    block counter ``counters[i]`` and three 32-bit nonce words ``nonces[i]``; (N, 16) little-endian uint32 words, the
    64 keystream bytes of each block. Equal, word for word, to the ``cryptography`` package's ChaCha20 (tested on
    random keys, counters and offsets, and against RFC 7539's test vectors); used where many short keystreams are
    needed at once — one numpy operation serves every block, where a cipher object per key costs ≈ 10 µs."""
    n = len(keys)
    k = np.ascontiguousarray(keys).view("<u4").reshape(n, 8)
    init = [np.full(n, c, dtype=np.uint32) for c in _SIGMA] + [k[:, j].copy() for j in range(8)]
    init += [np.asarray(counters, dtype=np.uint32).reshape(n).copy()]
    nonces = np.asarray(nonces, dtype=np.uint32).reshape(n, 3)
    init += [nonces[:, j].copy() for j in range(3)]
    x = [w.copy() for w in init]
    tmp = np.empty(n, dtype=np.uint32)

    def quarter(a: int, b: int, c: int, d: int) -> None:  # a += b; d ^= a; d <<<= 16; c += d; b ^= c; b <<<= 12; …
        for p, q, r, n in ((a, b, d, 16), (c, d, b, 12), (a, b, d, 8), (c, d, b, 7)):
            np.add(x[p], x[q], out=x[p])
            np.bitwise_xor(x[r], x[p], out=x[r])
            _rotl(x[r], n, tmp)

    for _ in range(10):
        quarter(0, 4, 8, 12)
        quarter(1, 5, 9, 13)
        quarter(2, 6, 10, 14)
        quarter(3, 7, 11, 15)
        quarter(0, 5, 10, 15)
        quarter(1, 6, 11, 12)
        quarter(2, 7, 8, 13)
        quarter(3, 4, 9, 14)
    out = np.empty((n, 16), dtype="<u4")
    for j in range(16):
        np.add(x[j], init[j], out=out[:, j])
    return out


def _fold256(keys: np.ndarray, values: np.ndarray | int) -> np.ndarray:
    """fold of 256-bit keys, broadcasting: BLAKE2b-256 keyed by k of v's 8 bytes (personalised "privdl/v2/fold"). One
    keyed hasher per key of ``keys`` (a block of counters folds each key many times: each fold then costs a copy)."""
    k, v = np.broadcast_arrays(keys, _u64(values))
    shape = k.shape
    source = np.ascontiguousarray(keys).reshape(-1)
    which = np.broadcast_to(np.arange(source.size).reshape(np.shape(keys)), shape).reshape(-1).tolist()
    def hasher(j: int):
        return hashlib.blake2b(digest_size=32, key=source[j].tobytes(), person=b"privdl/v2/fold")

    hashers = [hasher(j) for j in range(source.size)] if source.size < len(which) else None
    digests = []
    for j, value in zip(which, v.reshape(-1).tolist()):
        h = hasher(j) if hashers is None else hashers[j].copy()
        h.update(value.to_bytes(8, "little"))
        digests.append(h.digest())
    return np.frombuffer(b"".join(digests), dtype=KEY256).reshape(shape).copy()


def bits(keys: np.ndarray, size: int, start: int = 0) -> np.ndarray:
    """Outputs ``start + 1 … start + size`` of the SplitMix64 stream of every key: (m, size) uint64, element j =
    mix(k + j·γ). Row i depends only on keys[i] (and a prefix of a longer draw equals the shorter draw)."""
    k = _u64(keys).reshape(-1)
    with np.errstate(over="ignore"):
        z = np.add.outer(k, np.arange(start + 1, start + size + 1, dtype=np.uint64) * GOLDEN)
    return mix64(z)


#: :func:`stream` computes the blocks of at least this many keys with :func:`chacha20_blocks` vectorised over them
#: (≈ 0.5 µs a block after ≈ 2.5 ms of fixed cost), when each needs at most ``VECTOR_BLOCKS`` blocks; fewer keys or
#: longer rows go through one ``cryptography`` (OpenSSL) cipher per key (≈ 20 µs a key, fast per block)
VECTOR_KEYS, VECTOR_BLOCKS = 200, 16


def stream(keys: np.ndarray, size: int, start: int = 0) -> np.ndarray:
    """Words ``start … start + size − 1`` of the ChaCha20 keystream of every 256-bit key (the key as ChaCha20's key;
    64-byte blocks from block ⌊start / 8⌋, the block counter in the nonce's first 4 bytes, the rest of the nonce
    zero): (m, size) uint64, row i from keys[i] alone — the same words whichever implementation computes them."""
    k = np.asarray(keys).reshape(-1)
    if k.dtype != KEY256:
        raise ValidationError(f"the ChaCha20 stream takes 256-bit keys, got {k.dtype}")
    first, skip = divmod(int(start), 8)
    blocks = (skip + size + 7) // 8
    if first + blocks > 1 << 32:
        raise ValidationError("a ChaCha20 draw past 2^32 blocks (2^35 numbers) of one key")
    if len(k) >= VECTOR_KEYS and blocks <= VECTOR_BLOCKS:
        counters = np.tile(np.arange(first, first + blocks, dtype=np.uint64), len(k))
        words = chacha20_blocks(np.repeat(k, blocks), counters, np.zeros((len(counters), 3), dtype=np.uint32))
        return words.view("<u8").reshape(len(k), blocks * 8)[:, skip:skip + size].astype(np.uint64)
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    out = np.empty((len(k), size), dtype=np.uint64)
    zeros = bytes((skip + size) * 8)
    nonce = first.to_bytes(4, "little") + bytes(12)
    for i in range(len(k)):
        cipher = Cipher(algorithms.ChaCha20(k[i].tobytes(), nonce), mode=None)
        out[i] = np.frombuffer(cipher.encryptor().update(zeros), dtype="<u8")[skip:]
    return out


def _keys(values: object) -> np.ndarray:
    """A flat array of keys: 256-bit keys as they are, integers as uint64."""
    arr = np.asarray(values)
    return (arr if arr.dtype == KEY256 else _u64(arr)).reshape(-1)


#: elements generated per block (8 MB of float64): temporaries stay below the allocator's mmap threshold
BLOCK = 1 << 20


def _blocks(m: int, size: int):
    """(row slice, column start, column count) blocks of at most about BLOCK elements."""
    if size >= BLOCK:
        for r in range(m):
            for c in range(0, size, BLOCK):
                yield slice(r, r + 1), c, min(BLOCK, size - c)
        return
    rows = max(1, BLOCK // max(size, 1))
    for lo in range(0, m, rows):
        yield slice(lo, min(m, lo + rows)), 0, size


def _fill(keys: np.ndarray, size: int, dtype: torch.dtype, transform) -> torch.Tensor:
    k = _keys(keys)
    out = torch.empty((len(k), size), dtype=dtype)
    words = stream if k.dtype == KEY256 else bits
    _count("chacha20" if k.dtype == KEY256 else "splitmix64", len(k) * size)
    for rows, c0, cols in _blocks(len(k), size):
        z = words(k[rows], cols, c0)
        z >>= np.uint64(11)
        out[rows, c0:c0 + cols] = transform(torch.from_numpy(z.view(np.int64)).to(torch.float64).mul_(2.0**-53))
    return out


def uniform(keys: np.ndarray, size: int) -> torch.Tensor:
    """(m, size) float64 uniforms in [0, 1) with 53 random bits each, one row per key."""
    return _fill(keys, size, torch.float64, lambda u: u)


#: rows at least this long are drawn row by row with numpy's Philox (see :func:`normal`)
WIDE = 4096


def inverse_normal(u: torch.Tensor) -> torch.Tensor:
    """Φ⁻¹(u + 2⁻⁵⁴) for float64 uniforms u on the grid k·2⁻⁵³ (so the argument is in (0, 1)), in place of u.

    SciPy's ``ndtri`` (Cephes, compiled once for the x86-64 baseline) rather than ``torch.special.ndtri``: ATen
    compiles that kernel once per CPU capability and picks the build by processor, and the builds round differently
    (its AVX2 build against its baseline build, ``ATEN_CPU_CAPABILITY=default``: 17 % of a million draws differ in
    the last bits, measured here). SciPy's value does not depend on that choice (benchmarks/exactness.py checks it
    under every capability), so every process of a run — and both holders of a shared seed — draw the same numbers
    on AVX2 and AVX-512 machines alike. Its tails call the C library's ``log``, which glibc also picks by processor
    (its FMA variant on every CPU with AVX2 or AVX-512)."""
    from scipy.special import ndtri

    x = u.numpy()
    x += 2.0**-54
    ndtri(x, out=x)
    return u


def normal(keys: np.ndarray, size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(m, size) standard normals, one row per key, computed in float64 and then cast (a float32 run sees the same
    draws as a float64 run, rounded).

    * ``size < WIDE``: Φ⁻¹(u) with u the key's SplitMix64 uniforms shifted to (0, 1) by half a step (|z| ≤ 8.3),
      vectorised over keys (many keys, short rows: the quadratic grid's thousands of replicas).
    * ``size ≥ WIDE``: numpy's ``Generator(Philox(key=k)).standard_normal`` (Philox4x64-10, Salmon et al. 2011,
      keyed by the row's key; numpy's ziggurat), one row at a time on up to ``torch.get_num_threads()`` threads
      (few keys, long rows: model-sized noise; 3–4× faster than Φ⁻¹ here and exact in the tails).

    Either way row i depends only on keys[i] and a prefix of a longer draw equals the shorter draw when both are
    on the same side of ``WIDE``."""
    k = _keys(keys)
    if size < WIDE or k.dtype == KEY256:
        return _fill(k, size, dtype, inverse_normal)
    _count("philox", len(k) * size)
    out = torch.empty((len(k), size), dtype=dtype)
    direct = dtype == torch.float64

    def row(i: int) -> None:
        buf = out[i].numpy() if direct else np.empty(size)
        np.random.Generator(np.random.Philox(key=int(k[i]))).standard_normal(size, out=buf)
        if not direct:
            out[i].copy_(torch.from_numpy(buf))

    _by_row(len(k), row)
    return out


def integers(keys: np.ndarray, size: int, high: int) -> torch.Tensor:
    """(m, size) int64 uniform on {0, …, high − 1}, one row per key: numpy's
    ``Generator(Philox(key=k)).integers`` (exact, unbiased), rows on up to ``torch.get_num_threads()`` threads. Meant
    for long rows (random positions in model-sized vectors); row i depends only on keys[i]."""
    k = _keys(keys)
    if k.dtype == KEY256:
        if high < 1:
            raise ValidationError(f"integers need high >= 1, got {high}")
        return uniform(k, size).mul_(high).floor_().to(torch.int64).clamp_(max=high - 1)
    _count("philox", len(k) * size)
    out = torch.empty((len(k), size), dtype=torch.int64)

    def row(i: int) -> None:
        out[i].copy_(torch.from_numpy(np.random.Generator(np.random.Philox(key=int(k[i]))).integers(
            0, high, size, dtype=np.int64)))

    _by_row(len(k), row)
    return out


def _by_row(rows: int, row) -> None:
    """``row(i)`` for every row, on up to ``torch.get_num_threads()`` threads (numpy's fills release the GIL)."""
    workers = min(rows, torch.get_num_threads())
    if workers > 1:
        list(_pool(workers).map(row, range(rows)))
    else:
        for i in range(rows):
            row(i)


_POOL: tuple[int, int, ThreadPoolExecutor] | None = None


def _pool(workers: int) -> ThreadPoolExecutor:
    """A thread pool for wide draws (numpy's fill releases the GIL), rebuilt after a fork or a thread-count change."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < workers:
        _POOL = (os.getpid(), workers, ThreadPoolExecutor(workers, thread_name_prefix="privdl-keys"))
    return _POOL[2]


def hash_key(*parts: object) -> int:
    """A 64-bit key from strings and integers (SHA-256 of their typed text): the root of every derivation."""
    text = "\x1f".join(f"{type(p).__name__}:{p}" for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def derive_seed(*parts: object) -> int:
    """A 63-bit seed for a ``torch``/``numpy`` generator from strings and integers (for public, shared draws such as
    the common initial model)."""
    return hash_key(*parts) >> 1


class KeySource(Protocol):
    """Where draws get their keys. ``own`` keys are known to one agent (vectorised over agents, optionally qualified
    by extra integers such as a neighbour); ``shared`` keys to exactly ``holders``. ``public`` keys to everyone
    (integers: they seed a ``torch.Generator``). A source of 256-bit keys says so with ``key_dtype = KEY256``."""

    name: str

    def own(self, purpose: str, agents: np.ndarray, *qualifiers: np.ndarray) -> np.ndarray: ...

    def shared(self, purpose: str, holders: Sequence[int]) -> int: ...

    def public(self, purpose: str) -> int: ...


@functools.lru_cache(maxsize=1 << 16)  # sweeps ask for the same holders' keys of the same root many times
def _shared_key(base: int, members: tuple[int, ...]) -> int:
    k = base
    for h in members:
        k = fold_int(k, h)
    return k


@dataclass
class RootKeys:
    """Every key derived from one root seed (the simulator): ``own(purpose, i)`` = fold(H(root, purpose, own), i),
    ``shared(purpose, H)`` = fold over the sorted holders of H(root, purpose, shared). Reproducible, and any agent's
    draws can be recomputed alone."""

    root: int
    name: str = "root"
    _purposes: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.root, (int, np.integer)) or isinstance(self.root, bool) or self.root < 0:
            raise ValidationError(f"the root seed must be an integer >= 0, got {self.root!r}")
        self.root = int(self.root)

    def _base(self, purpose: str, kind: str) -> int:
        key = (purpose, kind)
        if key not in self._purposes:
            self._purposes[key] = hash_key("privdl", self.root, purpose, kind)
        return self._purposes[key]

    def own(self, purpose: str, agents: np.ndarray, *qualifiers: np.ndarray) -> np.ndarray:
        k = fold(self._base(purpose, "own"), agents)
        for q in qualifiers:
            k = fold(k, q)
        return k

    def shared(self, purpose: str, holders: Sequence[int]) -> int:
        members = tuple(sorted({int(h) for h in holders}))
        if not members:
            raise ValidationError(f"a shared draw ({purpose!r}) needs at least one holder")
        return _shared_key(self._base(purpose, "shared"), members)

    def public(self, purpose: str) -> int:
        return self._base(purpose, "public")


#: the key a slice uses in place of an agent's it does not hold (its draws fill rows that are never used or sent)
NOT_HELD = hash_key("privdl", "not held")
_NOT_HELD_WIDE = np.void(hashlib.sha256(b"privdl/v2/not held").digest())


def not_held(dtype: np.dtype) -> np.uint64 | np.void:
    """:data:`NOT_HELD` as a key of ``dtype`` (a public placeholder: its draws fill rows nobody uses)."""
    return _NOT_HELD_WIDE if np.dtype(dtype) == KEY256 else np.uint64(NOT_HELD)


class HeldKeys:
    """The key source of an engine that holds only ``held`` agents (:class:`privdl.placement.Placement`): own keys
    of held agents and shared keys of groups with a held member come from ``source``; any other key is the
    placeholder ``NOT_HELD`` — the slice never derives another agent's key, and the rows it fills with the
    placeholder's numbers belong to agents it does not hold (never sent, never combined into a held row).
    ``asked`` records every agent and group whose real key was derived (tests check it holds only held agents)."""

    def __init__(self, source: KeySource, held: np.ndarray, *, record: bool = False) -> None:
        self.source, self.held = source, np.asarray(held, dtype=bool)
        self.key_dtype = key_dtype(source)
        self.name = f"{source.name} (held: {int(self.held.sum())} of {len(self.held)})"
        self.asked: set | None = set() if record else None

    def own(self, purpose: str, agents: np.ndarray, *qualifiers: np.ndarray) -> np.ndarray:
        agents = np.asarray(agents, dtype=np.int64)
        mine = self.held[agents % len(self.held)]
        out = np.full(np.broadcast_shapes(agents.shape, *(np.shape(q) for q in qualifiers)),
                      not_held(self.key_dtype), dtype=self.key_dtype)
        if mine.any():
            quals = [np.broadcast_to(np.asarray(q), out.shape)[mine] for q in qualifiers]
            out[mine] = self.source.own(purpose, np.broadcast_to(agents, out.shape)[mine], *quals)
            if self.asked is not None:
                self.asked.update(int(a) for a in np.unique(np.broadcast_to(agents, out.shape)[mine]))
        return out

    def shared(self, purpose: str, holders: Sequence[int]) -> int:
        members = sorted({int(h) for h in holders})
        if not any(self.held[h % len(self.held)] for h in members):
            return not_held(self.key_dtype) if self.key_dtype == KEY256 else int(NOT_HELD)
        if self.asked is not None:
            self.asked.add(tuple(members))
        return self.source.shared(purpose, members)

    def public(self, purpose: str) -> int:
        return self.source.public(purpose)


class _Lookahead:
    """Small keyed draws for the next counters, computed in one block once a purpose's counters run consecutively.

    A run of thousands of rounds on a small problem (seed 002's filtering: 250 rows of 6 numbers per round) spends
    most of its time in the Python overhead of one tiny keyed draw per round and purpose. A counter-based draw can
    be computed ahead: row i of counter c depends only on fold(key_i, c), so the block of counters c … c + B − 1
    is one vectorised call and each round then takes its slice — the same numbers bit for bit (tested). Only draws
    of fewer than ``WIDE`` numbers per row are blocked (the Φ⁻¹ and uniform paths, vectorised over keys), only after
    two consecutive counters of the same signature (purpose, size, rows), and at most ``NUMBERS`` numbers per block;
    a jump in the counters drops the block. Every served slice is a copy (callers may work in place on it)."""

    NUMBERS = 1 << 17  # numbers per block (1 MB of float64)
    SPAN = 256  # counters per block at most
    SIGNATURES = 64  # blocks kept at once

    def __init__(self) -> None:
        self._last: dict[tuple, int] = {}
        self._blocks: dict[tuple, tuple[int, torch.Tensor]] = {}

    def get(self, sig: tuple, counter: int, rows: int, draw_block, then=None) -> torch.Tensor | None:
        """The draw of ``counter`` for ``sig`` (``rows`` numbers per counter) from a block — computing the next
        block when the counters run on — or None to draw it directly. ``draw_block(counters)`` draws counters (B,)
        in one call as (B·rows, size). ``then``: an elementwise function (broadcasting per-row columns) applied to
        the whole block (B, m, size) once; what it serves is then read only, not copied (``Keys._draw``)."""
        block = self._blocks.get(sig)
        if block is not None:
            i = counter - block[0]
            if 0 <= i < len(block[1]):  # the block's counters as a tuple of views: no select op per draw
                self._last[sig] = counter
                return block[1][i].clone() if then is None else block[1][i]
            del self._blocks[sig]
        last, self._last[sig] = self._last.get(sig), counter
        span = min(self.SPAN, self.NUMBERS // max(1, rows))
        if last != counter - 1 or span < 8:
            return None
        if len(self._blocks) >= self.SIGNATURES or len(self._last) > 4 * self.SIGNATURES:
            self._blocks.clear()
            self._last = {sig: counter}
        values = draw_block(np.arange(counter, counter + span, dtype=np.uint64))
        values = values.view(span, -1, *values.shape[1:])
        if then is not None:
            values = then(values)
        served = values.unbind(0)
        self._blocks[sig] = (counter, served)
        return served[0].clone() if then is None else served[0]


class Keys:
    """The keys of one run, or of R stacked replicas: row r·n + i is agent i of replica r, whose draws come from
    replica r's key source. Draw functions take global row indices; counters are folded in per draw."""

    def __init__(self, sources: Sequence[KeySource] | KeySource | int, n: int) -> None:
        if isinstance(sources, (int, np.integer)):
            sources = [RootKeys(int(sources))]
        elif not isinstance(sources, Sequence):
            sources = [sources]
        if not sources:
            raise ValidationError("Keys needs at least one key source")
        if not (isinstance(n, (int, np.integer)) and n >= 1):
            raise ValidationError(f"number of agents must be >= 1, got {n!r}")
        self.sources, self.n = list(sources), int(n)
        self.rows = self.n * len(self.sources)
        self._own: dict[str, np.ndarray] = {}
        self._distinct: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        self._ahead = _Lookahead()

    @property
    def replicas(self) -> int:
        return len(self.sources)

    @classmethod
    def from_seeds(cls, seeds: Sequence[int], n: int) -> "Keys":
        """Stacked replicas, replica r keyed by root seed ``seeds[r]`` (exactly the keys of its single run)."""
        return cls([RootKeys(int(s)) for s in seeds], n)

    def agent(self, rows: np.ndarray | torch.Tensor) -> np.ndarray:
        """The agent index (within its replica) of each global row."""
        return np.asarray(rows, dtype=np.int64) % self.n

    def own(self, purpose: str, rows: np.ndarray | torch.Tensor | None = None,
            requesters: np.ndarray | torch.Tensor | None = None) -> np.ndarray:
        """The own key of each row's agent for ``purpose``, for a draw it makes at the request of agent
        ``requesters[j]`` (default: itself): fold(own key, requester), exactly the source's own(purpose, agent,
        requester). Rows of different replicas use their replica's source."""
        if purpose not in self._own:
            agents = np.arange(self.n)
            self._own[purpose] = np.concatenate([s.own(purpose, agents) for s in self.sources])
        base = self._own[purpose]
        r = np.arange(self.rows) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows is not None and r.size and (r.min() < 0 or r.max() >= self.rows):
            raise ValidationError(f"row index out of range 0..{self.rows - 1}")
        q = r if requesters is None else np.asarray(requesters, dtype=np.int64).reshape(-1)
        if q.shape != r.shape:
            raise ValidationError(f"one requester per row: {q.shape} vs {r.shape}")
        return fold(base[r], q % self.n)

    def distinct(self, purpose: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Every row's own self-requested key, deduplicated: (distinct keys, index of each row's key or None when
        they are all distinct). Replicas of a sweep that share a root seed share these keys, hence their draws:
        each distinct key is drawn once."""
        if purpose not in self._distinct:
            keys = self.own(purpose)
            uniq, inverse = np.unique(keys, return_inverse=True)
            self._distinct[purpose] = (keys, None) if len(uniq) == len(keys) else (uniq, inverse)
        return self._distinct[purpose]

    def shared(self, purpose: str, holders: Sequence[int], replica: int = 0) -> int:
        return self.sources[replica].shared(purpose, holders)

    def generator(self, purpose: str, replica: int = 0) -> torch.Generator:
        """A CPU ``torch.Generator`` for a public draw every agent of the replica can make (the common initial
        model)."""
        g = torch.Generator()
        g.manual_seed(self.sources[replica].public(purpose) >> 1)
        return g

    # ---- draws ----------------------------------------------------------------------------------------------------
    def _draw(self, fn, purpose: str, counter: int, size: int, rows, requesters, then=None, **kw) -> torch.Tensor:
        everyone = rows is None and requesters is None
        keys, inverse = self.distinct(purpose) if everyone else (None, None)
        # then = (token, f): f applied to the draw — to a lookahead block at once where the rows are the draw's
        post = None if then is None or inverse is not None else then[1]

        def own() -> np.ndarray:  # the rows' keys, computed only when something is drawn
            return keys if keys is not None else self.own(purpose, rows, requesters)

        out = None
        if size < WIDE and fn is not integers:  # small rows: from a block drawn ahead once the counters run on
            r = None if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
            q = None if requesters is None else np.asarray(requesters, dtype=np.int64).reshape(-1)
            m = len(keys) if everyone else self.rows if r is None else len(r)
            sig = (fn, purpose, size, *kw.items(), None if r is None else r.tobytes(),
                   None if q is None else q.tobytes(), None if then is None else then[0])
            out = self._ahead.get(sig, counter, m * size,
                                  lambda c: fn(fold(own()[None], c[:, None]).reshape(-1), size, **kw), post)
        if out is None:
            out = fn(fold(own(), counter), size, **kw)
            if post is not None:
                out = post(out)
        if inverse is not None:
            out = out[torch.from_numpy(inverse)]
        return out if then is None or post is not None else then[1](out)

    def normal(self, purpose: str, counter: int, size: int, *, rows=None, requesters=None,
               dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """(m, size) normals: row j from the own key of rows[j] (all rows by default), requested by
        requesters[j] (default: itself), at ``counter``."""
        return self._draw(normal, purpose, counter, size, rows, requesters, dtype=dtype)

    def uniform(self, purpose: str, counter: int, size: int, *, rows=None, requesters=None,
                then: tuple | None = None) -> torch.Tensor:
        """(m, size) float64 uniforms in [0, 1) from the own keys at ``counter``. ``then = (token, f)``: f of them
        instead, for an elementwise f (per-row parameters as (m, 1) columns) whose values are the same bits wherever
        an entry is computed — applied to a lookahead block at once, served read only; ``token`` (hashable, compared
        by identity) names f and its parameters: the same token, the same f."""
        return self._draw(uniform, purpose, counter, size, rows, requesters, then)

    def integers(self, purpose: str, counter: int, size: int, high: int, *, rows=None,
                 requesters=None) -> torch.Tensor:
        """(m, size) int64 uniform on {0, …, high − 1} from the own keys at ``counter`` (:func:`integers`)."""
        return self._draw(integers, purpose, counter, size, rows, requesters, high=high)


@dataclass(frozen=True)
class Draws:
    """The keyed draws of one access for a set of rows: row j uses the own key of ``rows[j]`` for ``purpose``,
    requested by ``requesters[j]`` (a cross access; default: itself), at ``counter``; ``rows = None``: every row of
    the run, each for itself. What a task's sampling gets: it can draw uniforms or normals per row, never another
    agent's numbers."""

    keys: Keys
    purpose: str
    counter: int
    rows: np.ndarray | None = None
    requesters: np.ndarray | None = None

    def uniform(self, size: int, then: tuple | None = None) -> torch.Tensor:
        """(m, size) uniforms, or ``then[1]`` of them (read only: :meth:`Keys.uniform`)."""
        return self.keys.uniform(self.purpose, self.counter, size, rows=self.rows, requesters=self.requesters,
                                 then=then)

    def normal(self, size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        return self.keys.normal(self.purpose, self.counter, size, rows=self.rows, requesters=self.requesters,
                                dtype=dtype)


__all__ = ["DRAWN", "GOLDEN", "KEY256", "Draws", "HeldKeys", "KeySource", "Keys", "NOT_HELD", "RootKeys", "as_keys", "bits",
           "derive_seed", "drawn", "fold", "hash_key", "integers", "is_wide", "key256", "key_dtype", "mix64", "normal",
           "not_held", "stream", "uniform"]
