"""Agreed keys (``runtime.keys = "agreed"``): the run's shared randomness comes from key exchange between the agents
that share it, not from the root seed in the config (../shared/RUNTIME.md, "Keys").

At the start of a run every process (or slice) runs :func:`agree` for the agents it holds:

1. **X25519 over the links.** Each held agent draws an X25519 private key. For every pair of agents that share
   randomness — every edge of the network, and (leader, member) for the seed groups of more than two — the two
   ends exchange public keys: one message per pair of processes, over the run's own transport (never the rendezvous
   store), then each end computes the shared secret. Pairs inside one process agree locally.
2. **HKDF.** ``P_ab = HKDF-SHA256(shared_ab, salt, info="privdl/v1/pair/<a>-<b>")`` (a < b), with
   ``salt = SHA-256(context, W)``: the run's identity and its mixing weights, so two runs never share a key.
3. **Groups of more than two** (Whisper / HBC seed groups): the smallest member draws a 256-bit group secret and
   sends it to every other member wrapped with ChaCha20-Poly1305 under a key derived from their pairwise secret
   (``HKDF(P_ab, "privdl/v1/wrap/a-b")``, apart from the draw keys; a random 96-bit nonce; the group and the
   member as associated data); a member in another process receives only that ciphertext.
4. **Keys of draws.** A draw that agents a < b share for ``purpose`` uses the first 64 bits of
   ``HKDF(P_ab, salt, info="privdl/v1/shared/<purpose>/<a>-<b>")`` (a group: of its secret, info naming all its
   members); an agent's own draws use ``HKDF(O_i, salt, info="privdl/v1/own/<purpose>/<i>")`` of a 256-bit secret
   ``O_i`` drawn by its process and never sent. The counter-based generators of :mod:`privdl.keys` then draw from
   those keys exactly as they do from root-derived ones, so DECOR's two ends of an edge draw the same numbers (their
   terms cancel) and a Whisper group's members draw the same seed noise (the covariance is R).

What crosses the transport during setup: public keys (32 bytes each) and wrapped group secrets (12 + 32 + 16 bytes
each), under the tag ``privdl/setup/...`` (counted as setup bytes, apart from the payload). No private key, shared
secret, derived key or seed is ever sent: ``tests/test_agreement.py`` records every byte the transports and the
rendezvous store carry and finds none of :meth:`AgreedKeys.secrets` in them.

Threat model (stated in the manifest): passive — eavesdroppers on any link and curious agents learn nothing of a
secret they do not hold; the exchange is not authenticated, so an active attacker who can rewrite a link's traffic
during setup could stand in the middle (long-term identity keys would close that; not built).

The run's draws are then made inside :func:`privdl.keys.secure_draws` (the ChaCha20 keystream, not SplitMix64,
whose outputs give their key away). Limits: each draw's key has 64 bits (the secrets behind them 256). Agreed-key runs match root-key runs in distribution, not bit for bit;
with ``entropy`` given (tests), every secret is a function of it and the run is a pure function of the config, the
same on any placement.
"""

from __future__ import annotations

import hashlib
import os
from typing import Callable, Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.exceptions import InvalidTag

from privdl.comm.sliced import SETUP, TransportError
from privdl.errors import ValidationError
from privdl.keys import KeySource, fold
from privdl.placement import Placement

#: how the manifest states what agreed keys protect against
THREAT_MODEL = ("passive: eavesdroppers on links and curious agents (draws from the ChaCha20 keystream with a one-way "
                "counter fold: observed noise does not reveal its key; against N observed draws a 2^64/N search finds "
                "one draw's 64-bit key, exposing that draw only); the X25519 exchange is not authenticated "
                "(an active attacker rewriting a link during setup could stand in the middle)")
NONCE, WRAPPED = 12, 12 + 32 + 16  # ChaCha20-Poly1305 nonce; a wrapped group secret: nonce, ciphertext, tag


def _hkdf(secret: bytes, salt: bytes, info: str, length: int = 32) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info.encode()).derive(secret)


def _u64(key: bytes) -> int:
    return int.from_bytes(key[:8], "little")


def salt_of(context: str, network) -> bytes:
    """SHA-256 of the run's identity and its mixing weights (edges and weights, in canonical order)."""
    e = network.edges
    h = hashlib.sha256(b"privdl/v1/salt\x1f" + context.encode())
    for t in (e.src, e.dst, e.weight, e.self_weight):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.digest()


def random_entropy(label: str) -> bytes:
    """32 fresh bytes from the operating system (``label`` names what they are for; unused)."""
    return os.urandom(32)


def seeded_entropy(root: int) -> Callable[[str], bytes]:
    """Deterministic entropy for tests: SHA-256(root, label). Every secret is then a function of the root and the
    run is the same on any placement — never use it for privacy."""
    def draw(label: str) -> bytes:
        return hashlib.sha256(f"privdl/v1/test-entropy\x1f{root}\x1f{label}".encode()).digest()
    return draw


class AgreedKeys:
    """The key source of the agents one process holds, from agreed secrets (:func:`agree` builds it). Own keys:
    of held agents only; shared keys: of pairs and groups with a held member that were agreed at setup; public
    keys (the common initial model): from the root, as every agent can compute them."""

    name = "agreed"

    def __init__(self, *, public: KeySource, salt: bytes, n: int, own: dict[int, bytes], pairs: dict[tuple[int, int], bytes],
                 groups: dict[tuple[int, ...], bytes], private: dict[int, bytes] | None = None) -> None:
        self._public, self.salt, self.n = public, salt, int(n)
        self._own, self._pairs, self._groups = own, pairs, groups
        self._private = private  # kept only for an audit (agree(keep=True)); dropped after setup otherwise
        self._own_base: dict[str, np.ndarray] = {}
        self._derived: list[bytes] | None = [] if private is not None else None
        self._cache: dict[tuple[str, tuple[int, ...]], int] = {}

    def _key(self, secret: bytes, info: str) -> int:
        key = _hkdf(secret, self.salt, info)
        if self._derived is not None:
            self._derived.append(key)
        return _u64(key)

    def own(self, purpose: str, agents: np.ndarray, *qualifiers: np.ndarray) -> np.ndarray:
        if purpose not in self._own_base:
            base = np.zeros(self.n, dtype=np.uint64)
            for i, secret in self._own.items():
                base[i] = self._key(secret, f"privdl/v1/own/{purpose}/{i}")
            self._own_base[purpose] = base
        a = np.asarray(agents, dtype=np.int64)
        unknown = ~np.isin(a, list(self._own))
        if unknown.any():
            raise ValidationError(f"agreed keys: agent {int(a[unknown].reshape(-1)[0])} is not held here (its own "
                                  "secret never leaves its process)")
        k = self._own_base[purpose][a]
        for q in qualifiers:
            k = fold(k, q)
        return k

    def shared(self, purpose: str, holders: Sequence[int]) -> int:
        members = tuple(sorted({int(h) for h in holders}))
        if (purpose, members) not in self._cache:
            self._cache[(purpose, members)] = self._shared(purpose, members)
        return self._cache[(purpose, members)]

    def _shared(self, purpose: str, members: tuple[int, ...]) -> int:
        if len(members) == 1:
            (i,) = members
            if i not in self._own:
                raise ValidationError(f"agreed keys: agent {i} is not held here")
            return self._key(self._own[i], f"privdl/v1/single/{purpose}/{i}")
        secret = self._pairs.get(members) if len(members) == 2 else self._groups.get(members)
        if secret is None:
            raise ValidationError(f"agreed keys: no key was agreed for the agents {list(members)} (purpose "
                                  f"{purpose!r}); pairs agreed: the network's edges and the seed groups' (leader, "
                                  "member) pairs")
        return self._key(secret, f"privdl/v1/shared/{purpose}/{'-'.join(map(str, members))}")

    def public(self, purpose: str) -> int:
        return self._public.public(purpose)

    def secrets(self) -> list[bytes]:
        """Every secret this source held or derived (private keys, own, pairwise and group secrets, the draws' keys
        and their 64 bits): what must never appear on the wire. Only for an audit (``agree(keep=True)``)."""
        if self._private is None:
            raise ValidationError("these agreed keys were not kept for an audit: agree(..., keep=True)")
        out = [*self._private.values(), *self._own.values(), *self._pairs.values(), *self._groups.values()]
        return out + self._derived + [k[:8] for k in self._derived]


def needed_pairs(network, groups: Sequence[tuple[int, ...]]) -> list[tuple[int, int]]:
    """The pairs of agents that run X25519: every edge (a < b), and (leader, member) of every group of more than two
    (the leader: its smallest member)."""
    e = network.edges
    pairs = {(min(a, b), max(a, b)) for a, b in zip(e.src.tolist(), e.dst.tolist()) if a != b}
    for g in groups:
        if len(g) > 2:
            leader = g[0]
            pairs |= {(leader, m) for m in g[1:]}
        elif len(g) == 2:
            pairs.add((g[0], g[1]))
    return sorted(pairs)


def agree(*, part: int, placement: Placement, owner: np.ndarray, network, groups: Sequence[Sequence[int]],
          transport, public: KeySource, context: str, entropy: Callable[[str], bytes] | None = None,
          keep: bool = False) -> AgreedKeys:
    """Run the key agreement for the agents of ``placement`` (slice ``part``; ``owner[i]``: the slice holding agent
    i) over ``transport``; every slice calls it at the same point with the same ``network``, ``groups`` (the
    mechanism's seed groups: :func:`shared_groups`) and ``context`` (the run's identity); ``public`` gives the
    public keys (the run's root source: the common initial model). ``keep``: keep the private keys and record
    every derived key, for :meth:`AgreedKeys.secrets` (tests that scan the wire); otherwise they are dropped. ``entropy(label)`` gives
    32 random bytes (default: the operating system's)."""
    draw = entropy or random_entropy
    n = network.n
    held = [int(a) for a in placement.agents]
    mine = set(held)
    groups = sorted({tuple(sorted({int(a) for a in g})) for g in groups})
    for g in groups:
        if not all(0 <= a < n for a in g):
            raise ValidationError(f"a seed group {list(g)} names agents outside 0..{n - 1}")
    pairs = needed_pairs(network, groups)
    salt = salt_of(context, network)
    private = {i: draw(f"x25519/{i}") for i in held}
    keys = {i: X25519PrivateKey.from_private_bytes(private[i]) for i in held}
    announced = {i: keys[i].public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for i in held}
    own = {i: draw(f"own/{i}") for i in held}
    peers = [q for q in range(transport.parts) if q != part]

    # 1. public keys: to each peer, those of my agents that pair with its agents (increasing agent order)
    def announce(frm: int, to: int) -> list[int]:
        return sorted({a for a, b in pairs if owner[a] == frm and owner[b] == to} |
                      {b for a, b in pairs if owner[b] == frm and owner[a] == to})

    for q in peers:
        mine_out = announce(part, q)
        if mine_out:
            value = torch.tensor(np.frombuffer(b"".join(announced[i] for i in mine_out), dtype=np.uint8)
                                 ).reshape(len(mine_out), 32)
            transport.send(part, q, (-1, f"{SETUP}public", 0, str(value.dtype), tuple(value.shape)), value)
    theirs: dict[int, bytes] = {}
    for q in peers:
        expect = announce(q, part)
        if expect:
            got = transport.recv(q, part, (-1, f"{SETUP}public", 0, "torch.uint8", (len(expect), 32)))
            for i, row in zip(expect, got.numpy()):
                theirs[i] = row.tobytes()
    transport.flush(part)
    known = {**theirs, **announced}

    # 2. pairwise secrets for every pair with a held end
    shared: dict[tuple[int, int], bytes] = {}
    for a, b in pairs:
        if a in mine or b in mine:
            me, other = (a, b) if a in mine else (b, a)
            try:
                secret = keys[me].exchange(X25519PublicKey.from_public_bytes(known[other]))
            except ValueError as exc:  # an all-zero (low-order) public key
                raise TransportError(f"agent {me}: the public key agent {other} sent is not usable ({exc})") from None
            shared[(a, b)] = _hkdf(secret, salt, f"privdl/v1/pair/{a}-{b}")

    # 3. group secrets: the leader draws, wraps for every member under their pairwise key
    secrets: dict[tuple[int, ...], bytes] = {}
    outgoing: dict[int, list[bytes]] = {q: [] for q in peers}
    for g in groups:
        if len(g) <= 2 or g[0] not in mine:
            continue
        leader = g[0]
        secrets[g] = draw(f"group/{'-'.join(map(str, g))}")
        for m in g[1:]:
            if m in mine:
                continue
            nonce = draw(f"nonce/{'-'.join(map(str, g))}/{m}")[:NONCE]
            box = ChaCha20Poly1305(_wrap_key(shared[(leader, m)], salt, leader, m))
            outgoing[int(owner[m])].append(nonce + box.encrypt(nonce, secrets[g], _aad(g, m)))

    def wrapped_for(frm: int, to: int) -> list[tuple[tuple[int, ...], int]]:
        return [(g, m) for g in groups if len(g) > 2 and owner[g[0]] == frm for m in g[1:] if owner[m] == to]

    for q in peers:
        if outgoing[q]:
            value = torch.tensor(np.frombuffer(b"".join(outgoing[q]), dtype=np.uint8)).reshape(-1, WRAPPED)
            transport.send(part, q, (-1, f"{SETUP}groups", 1, str(value.dtype), tuple(value.shape)), value)
    for q in peers:
        expect = wrapped_for(q, part)
        if expect:
            got = transport.recv(q, part, (-1, f"{SETUP}groups", 1, "torch.uint8", (len(expect), WRAPPED)))
            for (g, m), row in zip(expect, got.numpy()):
                blob = row.tobytes()
                try:
                    secret = ChaCha20Poly1305(_wrap_key(shared[(g[0], m)], salt, g[0], m)).decrypt(
                        blob[:NONCE], blob[NONCE:], _aad(g, m))
                except InvalidTag:
                    raise TransportError(f"agent {m}: the group secret of {list(g)} from agent {g[0]} failed "
                                         "authentication (a corrupted or forged setup message)") from None
                secrets.setdefault(g, secret)
    transport.flush(part)
    return AgreedKeys(public=public, salt=salt, n=n, own=own, pairs=shared, groups=secrets,
                      private=private if keep else None)


def agree_alone(*, network, mechanism, public: KeySource, context: str,
                entropy: Callable[[str], bytes] | None = None) -> AgreedKeys:
    """Agreed keys of a run whose agents are all in this process (the simulator): the same derivation, every
    exchange local."""
    from privdl.comm.sliced import Transport
    from privdl.placement import Placement

    n = network.n
    return agree(part=0, placement=Placement(n, tuple(range(n))), owner=np.zeros(n, dtype=np.int64),
                 network=network, groups=shared_groups(mechanism, n), transport=Transport(1), public=public,
                 context=context, entropy=entropy)


def _wrap_key(pair: bytes, salt: bytes, a: int, b: int) -> bytes:
    """The key that wraps group secrets between a and b: derived apart from the pair's draw keys."""
    return _hkdf(pair, salt, f"privdl/v1/wrap/{min(a, b)}-{max(a, b)}")


def _aad(group: tuple[int, ...], member: int) -> bytes:
    return f"privdl/v1/group/{'-'.join(map(str, group))}/{member}".encode()


class _Recording:
    """A key source that records the holder sets a mechanism asks shared keys of (:func:`shared_groups`)."""

    name = "recording"

    def __init__(self) -> None:
        self.groups: set[tuple[int, ...]] = set()

    def own(self, purpose, agents, *qualifiers):
        return np.zeros(np.broadcast_shapes(np.shape(agents), *(np.shape(q) for q in qualifiers)), dtype=np.uint64)

    def shared(self, purpose, holders):
        self.groups.add(tuple(sorted({int(h) for h in holders})))
        return 0

    def public(self, purpose):
        return 0


def shared_groups(mechanism, n: int) -> list[tuple[int, ...]]:
    """The holder sets of every shared draw ``mechanism`` makes at bind time (DECOR's edges, Whisper's and HBC's
    seed groups), found by binding a copy to a recording key source. Edges' keys asked later (PD-LMS) are pairs of
    neighbours, which are always agreed."""
    import copy

    from privdl.keys import Keys
    from privdl.mechanisms.base import MechanismEnv

    probe = _Recording()
    copy.deepcopy(mechanism).bind(MechanismEnv(Keys(probe, n)))
    return sorted(probe.groups)


__all__ = ["AgreedKeys", "THREAT_MODEL", "agree", "needed_pairs", "random_entropy", "agree_alone", "salt_of", "seeded_entropy",
           "shared_groups"]
