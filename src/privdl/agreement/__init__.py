"""Agreed keys (``runtime.keys = "agreed"``): the run's shared randomness comes from key exchange between the agents
that share it, not from the root seed in the config (../shared/RUNTIME.md, "Keys"). This package is the room of key
agreement — the protocol here, identities in :mod:`privdl.agreement.identity`, stored secrets in
:mod:`privdl.agreement.keystore` — below the simulator, the sliced backend, the runner and the runtime that use it
(docs/ARCHITECTURE.md, "Rooms and their order").

At the start of a run every process (or slice) runs :func:`agree` for the agents it holds:

1. **X25519 over the links.** Each held agent draws an X25519 private key. For every pair of agents that share
   randomness — every edge of the network, and (leader, member) for the seed groups of more than two — the two
   ends exchange public keys: one message per pair of processes, over the run's own transport (never the rendezvous
   store), then each end computes the shared secret. Pairs inside one process agree locally. With identities
   (``runtime.identity = "ed25519"``, :mod:`privdl.agreement.identity`) each public key travels with its agent's
   Ed25519 signature over (salt, agent, key) and is checked against the roster before it is used.
2. **HKDF, bound to the transcript.** ``P_ab = HKDF-SHA256(X25519(a, b), salt, info="privdl/v1/pair/<a>-<b>" ‖
   pk_a ‖ pk_b)`` (a < b; both public keys in the derivation, as libsodium's ``crypto_kx``), with
   ``salt = SHA-256(context, W)``: the run's identity and its mixing weights, so two runs never share a key.
3. **Groups of more than two** (Whisper / HBC seed groups): the smallest member draws a 256-bit group secret and
   sends it to every other member wrapped with ChaCha20-Poly1305 under ``HKDF(P_ab, salt, "privdl/v1/wrap/a-b")``
   (a key of its own, never a draw key; a random 96-bit nonce per wrap; the group and the member as associated
   data); a member in another process receives only that ciphertext.
4. **Keys of draws: 256 bits.** A draw that agents a < b share for ``purpose`` uses
   ``HKDF(P_ab, salt, info="privdl/v1/shared/<purpose>/<a>-<b>")`` (a group: of its secret, info naming all its
   members); an agent's own draws use ``HKDF(O_i, salt, info="privdl/v1/own/<purpose>/<i>")`` of a 256-bit secret
   ``O_i`` drawn by its process and never sent. Every one is a 32-byte :data:`privdl.keys.KEY256` key: the
   requester and the counter are folded in one way (BLAKE2b-256) and the numbers are ChaCha20's keystream under the
   result (:mod:`privdl.keys`) — no step of the path has fewer than 256 bits. DECOR's two ends of an edge draw the
   same numbers (their terms cancel) and a Whisper group's members the same seed noise (the covariance is R).
5. **Persisted** (:mod:`privdl.agreement.keystore`): given a store, each process writes its agents' secrets (mode
   0600) before any round runs, and a run started again loads them instead of agreeing — it replays the rounds it
   had released (same noise, same lots) rather than releasing them again with new noise. Each agent's checkpoint
   files are sealed with an HMAC under ``HKDF(O_i, salt, "privdl/v1/checkpoint/<i>")``.

What crosses the transport during setup: public keys (32 bytes each; with identities 128: key, signer, signature)
and wrapped group secrets (12 + 32 + 16 bytes each), under the tag ``privdl/setup/...`` (counted as setup bytes,
apart from the payload). No private key, shared secret, derived key or seed is ever sent:
``tests/test_agreement.py`` records every byte the transports and the rendezvous store carry and finds none of
:meth:`AgreedKeys.secrets` in them.

Threat model (stated in the manifest: :func:`threat_model`): eavesdroppers on any link and curious agents learn
nothing of a secret they do not hold; without identities the exchange is not authenticated (an active attacker who
can rewrite a link's traffic during setup could stand in the middle; a process could announce a key for an agent it
does not hold); with identities neither can. In every mode the process that gathers the metrics (process 0 of a
distributed run) receives every agent's model at every recorded round and at the end.

Agreed-key runs match root-key runs in distribution, not bit for bit; with ``entropy`` given (tests), every secret
is a function of it and the run is a pure function of the config, the same on any placement.
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

from privdl.agreement.identity import SIGNED, Identities
from privdl.agreement.keystore import KeyStoreError, SecretStore
from privdl.comm.transport import SETUP, TransportError
from privdl.errors import ValidationError
from privdl.keys import KEY256, KeySource, fold, key256
from privdl.placement import Placement
from privdl.runtime_spec import RuntimeSpec

NONCE, WRAPPED = 12, 12 + 32 + 16  # ChaCha20-Poly1305 nonce; a wrapped group secret: nonce, ciphertext, tag
PUBLIC = 32  # an X25519 public key


def threat_model(identity: str = "none", gathered: str = "process 0", summed: str | None = None) -> str:
    """How the manifest states what agreed keys protect against, for identity mode ``identity``. ``summed``: the
    process that sums the models into their average where the metrics are evaluated where the agents live (then
    ``gathered`` receives scalars only); None: ``gathered`` receives every model."""
    keys = ("passive and active on the links: eavesdroppers and curious agents learn no secret they do not hold "
            "(256-bit keys for every draw, ChaCha20 keystreams, one-way folds: observed noise reveals no key); every "
            "X25519 public key is signed by its agent's Ed25519 identity and checked against the roster before use, "
            "so no process or link can stand in for an agent it does not hold"
            if identity == "ed25519" else
            "passive: eavesdroppers on links and curious agents learn no secret they do not hold (256-bit keys for "
            "every draw, ChaCha20 keystreams, one-way folds: observed noise reveals no key); the X25519 exchange is "
            "not authenticated (runtime.identity = \"none\"): an active attacker rewriting a link during setup, "
            "or a process announcing a key for an agent it does not hold, could stand in the middle")
    who = gathered[:1].upper() + gathered[1:]
    if summed is not None:
        return (f"{keys}. {who} receives only the metrics' scalars; {summed} receives each process's sum of its "
                "agents' models at every recorded round (an agent's own model where a process holds one) to form "
                "their average (it computes the consensus distance and the metrics of the average): it is trusted "
                "with what it receives")
    return (f"{keys}. {who} receives every agent's model at every recorded round and at the end (it computes "
            "the metrics): it is trusted with what it gathers")


#: the manifest's statement for runs without identities
THREAT_MODEL = threat_model()


def _hkdf(secret: bytes, salt: bytes, info: bytes | str, length: int = 32) -> bytes:
    info = info.encode() if isinstance(info, str) else info
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


def pair_secret(raw: bytes, salt: bytes, a: int, b: int, public_a: bytes, public_b: bytes) -> bytes:
    """P_ab from the X25519 output of agents a < b and both their public keys (the transcript)."""
    if a >= b:
        raise ValidationError(f"a pair's secret is derived for a < b, got {a}, {b}")
    return _hkdf(raw, salt, f"privdl/v1/pair/{a}-{b}".encode() + b"\x1f" + public_a + public_b)


def wrap_key(pair: bytes, salt: bytes, a: int, b: int) -> bytes:
    """The key that wraps group secrets between a and b: derived apart from the pair's draw keys."""
    return _hkdf(pair, salt, f"privdl/v1/wrap/{min(a, b)}-{max(a, b)}")


def salt_of(context: str, network) -> bytes:
    """SHA-256 of the run's identity and its mixing weights (edges and weights, in canonical order)."""
    e = network.edges
    h = hashlib.sha256(b"privdl/v1/salt\x1f" + len(context.encode()).to_bytes(8, "little") + context.encode())
    for t in (e.src, e.dst, e.weight, e.self_weight):
        a = t.detach().cpu().contiguous().numpy()
        h.update(f"{a.dtype.str}{a.shape}".encode() + a.tobytes())  # framed: no two W hash alike
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


#: environment variable: a root for :func:`seeded_entropy` in every agreed run of this process (tests only: the
#: secrets are then a function of it, and the manifest says so)
TEST_ENTROPY = "PRIVDL_TEST_ENTROPY"


def config_options(cfg: dict, n: int, agents: Sequence[int]) -> dict:
    """``agree``'s ``entropy`` and ``identities`` for a run's config: the identities its ``[runtime]`` names (paths
    relative to the config's folder), loaded for ``agents``; seeded entropy when :data:`TEST_ENTROPY` is set."""
    from privdl.agreement.identity import load

    raw = os.environ.get(TEST_ENTROPY)
    entropy = None
    if raw:
        try:
            entropy = seeded_entropy(int(raw))
        except ValueError:
            raise ValidationError(f"{TEST_ENTROPY} must be an integer (a test's entropy root), got {raw!r}") from None
    return {"entropy": entropy, "identities": load(RuntimeSpec.of(cfg), n, agents, cfg.get("base_dir"))}


def keys_facts(cfg: dict, *, restored: bool, draws: dict[str, int], gathered: str = "process 0",
               summed: str | None = None) -> dict:
    """The manifest's ``keys`` section: the key mode, identities, where the entropy came from, whether the secrets
    were loaded from the run's store (a run started again), and the numbers drawn per generator."""
    runtime = RuntimeSpec.of(cfg)
    if not runtime.agreed:
        return {"mode": "root", "secret": False, "draws": draws}
    identity = runtime.identity
    return {"mode": "agreed", "identity": identity, "key_bits": 256,
            "entropy": (f"seeded from {TEST_ENTROPY} (a test: the secrets are not secret)"
                        if os.environ.get(TEST_ENTROPY) else "operating system"),
            "restored_from_store": bool(restored), "threat_model": threat_model(identity, gathered, summed),
            "draws": draws}


class AgreedKeys:
    """The key source of the agents one process holds, from agreed secrets (:func:`agree` builds it): 256-bit keys
    (:data:`privdl.keys.KEY256`). Own keys: of held agents only; shared keys: of pairs and groups with a held member
    that were agreed at setup; public keys (the common initial model): from the root, as every agent can compute
    them."""

    name = "agreed"
    key_dtype = KEY256

    def __init__(self, *, public: KeySource, salt: bytes, n: int, own: dict[int, bytes],
                 pairs: dict[tuple[int, int], bytes], groups: dict[tuple[int, ...], bytes],
                 audit: dict[str, list[bytes]] | None = None, restored: bool = False) -> None:
        self._public, self.salt, self.n = public, salt, int(n)
        self._own, self._pairs, self._groups = own, pairs, groups
        self._audit = audit  # kept only for an audit (agree(keep=True)): what must never cross the wire
        self.restored = restored  # loaded from the run's secret store (a run started again)
        self._own_base: dict[str, np.ndarray] = {}
        self._cache: dict[tuple[str, tuple[int, ...]], np.void] = {}

    def _key(self, secret: bytes, info: str) -> np.void:
        key = _hkdf(secret, self.salt, info)
        if self._audit is not None:
            self._audit["derived"].append(key)
        return key256(key)

    @property
    def agents(self) -> list[int]:
        return sorted(self._own)

    def own(self, purpose: str, agents: np.ndarray, *qualifiers: np.ndarray) -> np.ndarray:
        if purpose not in self._own_base:
            base = np.zeros(self.n, dtype=KEY256)
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

    def shared(self, purpose: str, holders: Sequence[int]) -> np.void:
        members = tuple(sorted({int(h) for h in holders}))
        if (purpose, members) not in self._cache:
            self._cache[(purpose, members)] = self._shared(purpose, members)
        return self._cache[(purpose, members)]

    def _shared(self, purpose: str, members: tuple[int, ...]) -> np.void:
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

    def checkpoint_key(self, agent: int) -> bytes:
        """The key of agent ``agent``'s checkpoint HMAC (from its own secret: only its holder can seal its files)."""
        if agent not in self._own:
            raise ValidationError(f"agreed keys: agent {agent} is not held here")
        key = _hkdf(self._own[agent], self.salt, f"privdl/v1/checkpoint/{agent}")
        if self._audit is not None:
            self._audit["derived"].append(key)
        return key

    def export(self, agent: int) -> dict:
        """Agent ``agent``'s secrets, for its secret file (:class:`privdl.agreement.keystore.SecretStore`): its own
        secret, the pairwise secrets of its pairs and the group secrets of its groups."""
        if agent not in self._own:
            raise ValidationError(f"agreed keys: agent {agent} is not held here")
        return {"own": self._own[agent], "pairs": {k: v for k, v in self._pairs.items() if agent in k},
                "groups": {k: v for k, v in self._groups.items() if agent in k}}

    @classmethod
    def restore(cls, secrets: dict[int, dict], *, public: KeySource, salt: bytes, n: int) -> "AgreedKeys":
        """The key source of the agents whose exported secrets are given (a run started again)."""
        own = {int(i): s["own"] for i, s in secrets.items()}
        pairs: dict = {}
        groups: dict = {}
        for s in secrets.values():
            pairs.update(s["pairs"])
            groups.update(s["groups"])
        return cls(public=public, salt=salt, n=n, own=own, pairs=pairs, groups=groups, restored=True)

    def secrets(self) -> list[bytes]:
        """Every secret this source held or derived (private keys, X25519 outputs, own, pairwise, wrapping and group
        secrets, the draws' 256-bit keys, the checkpoint keys, and 8-byte prefixes of each): what must never appear
        on the wire. Only for an audit (``agree(keep=True)``)."""
        if self._audit is None:
            raise ValidationError("these agreed keys were not kept for an audit: agree(..., keep=True)")
        out = [*self._audit["private"], *self._audit["raw"], *self._audit["wrap"], *self._own.values(),
               *self._pairs.values(), *self._groups.values(), *self._audit["derived"]]
        return out + [k[:8] for k in out]

    @property
    def private_keys(self) -> list[bytes]:
        """The X25519 private keys drawn at setup (an audit only)."""
        if self._audit is None:
            raise ValidationError("these agreed keys were not kept for an audit: agree(..., keep=True)")
        return list(self._audit["private"])


def needed_pairs(network, groups: Sequence[tuple[int, ...]]) -> list[tuple[int, int]]:
    """The pairs of agents that run X25519: every edge (a < b) — on a time-varying graph every pair its law may join
    —, and (leader, member) of every group of more than two
    (the leader: its smallest member)."""
    e = network.edges
    pairs = {(min(a, b), max(a, b)) for a, b in zip(e.src.tolist(), e.dst.tolist()) if a != b}
    dynamics = getattr(network, "dynamics", None)
    if dynamics is not None:  # a time-varying graph: every pair a round may join (its edges are drawn per round)
        pairs |= dynamics.possible_pairs()
    for g in groups:
        if len(g) > 2:
            leader = g[0]
            pairs |= {(leader, m) for m in g[1:]}
        elif len(g) == 2:
            pairs.add((g[0], g[1]))
    return sorted(pairs)


def _stored(store: SecretStore, part: int, held: list[int], transport) -> dict[int, dict] | None:
    """The held agents' stored secrets when every agent of the run has its final file (rounds may have been released
    under them: replay), None when setup never finished anywhere (no final file, or a crash while renaming: every
    file not final is pending — nothing was released; the stale files are removed and the run agrees anew).
    Refused when some final files exist and some agent has neither file: rounds may have been released under
    secrets that are now lost. Three control operations decide it for every process at once."""
    final, pending, none = store.state(held)
    anyone_lacks = transport.agree_max(part, int(bool(pending or none)))
    anyone_final = transport.agree_max(part, int(bool(final)))
    anyone_lost = transport.agree_max(part, int(bool(none)))
    if not anyone_lacks:
        return {i: store.load(i) for i in held}
    if not anyone_final or not anyone_lost:
        store.discard(held)
        return None
    where = (f"the secrets of agent{'s' if len(none) > 1 else ''} {', '.join(map(str, none))} are missing here "
             f"({store.path(none[0])})" if none else "other processes lack their agents' secret files")
    raise KeyStoreError(f"{where}, while the run's setup had finished (other agents' files in {store.folder} are "
                        "final): rounds may have been released under the lost secrets, and agreeing anew would "
                        f"release them again with new noise. Restore the missing files, or delete {store.folder} (and "
                        "the run's checkpoints) to start the run over as a new release")


def agree(*, part: int, placement: Placement, owner: np.ndarray, network, groups: Sequence[Sequence[int]],
          transport, public: KeySource, context: str, entropy: Callable[[str], bytes] | None = None,
          keep: bool = False, identities: Identities | None = None, store: str | os.PathLike | None = None,
          store_identity: dict | None = None) -> AgreedKeys:
    """Run the key agreement for the agents of ``placement`` (slice ``part``; ``owner[i]``: the slice holding agent
    i) over ``transport``; every slice calls it at the same point with the same ``network``, ``groups`` (the
    mechanism's seed groups: :func:`shared_groups`) and ``context`` (the run's identity); ``public`` gives the
    public keys (the run's root source: the common initial model). ``identities``: sign every announced X25519 key
    and check every received one against the roster. ``store`` (a folder, :mod:`privdl.agreement.keystore`): load the
    agents' secrets from it when every agent has them (a run started again: nothing is exchanged), else agree and
    write them there in two phases before returning — every process returns only once all have committed theirs, so
    no round is released under secrets that are not on disk; ``store_identity`` (config digest, source, inputs) must
    match the files'. ``keep``: record every secret, for :meth:`AgreedKeys.secrets` (tests that scan the wire).
    ``entropy(label)`` gives 32 random bytes (default: the operating system's)."""
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
    if store is not None:
        store = SecretStore(store, salt=salt, identity=store_identity)
    if store is not None:
        stored = _stored(store, part, held, transport)
        if stored is not None:
            return AgreedKeys.restore(stored, public=public, salt=salt, n=n)
    audit = {"private": [], "raw": [], "wrap": [], "derived": []} if keep else None
    private = {i: draw(f"x25519/{i}") for i in held}
    keys = {i: X25519PrivateKey.from_private_bytes(private[i]) for i in held}
    announced = {i: keys[i].public_key().public_bytes(Encoding.Raw, PublicFormat.Raw) for i in held}
    own = {i: draw(f"own/{i}") for i in held}
    peers = [q for q in range(transport.parts) if q != part]
    width = PUBLIC + (SIGNED if identities is not None else 0)

    # 1. public keys (signed with identities): to each peer, those of my agents that pair with its agents
    def announce(frm: int, to: int) -> list[int]:
        return sorted({a for a, b in pairs if owner[a] == frm and owner[b] == to} |
                      {b for a, b in pairs if owner[b] == frm and owner[a] == to})

    for q in peers:
        mine_out = announce(part, q)
        if mine_out:
            rows = [announced[i] + (identities.sign(salt, i, announced[i]) if identities is not None else b"")
                    for i in mine_out]
            value = torch.tensor(np.frombuffer(b"".join(rows), dtype=np.uint8)).reshape(len(mine_out), width)
            transport.send(part, q, (-1, f"{SETUP}public", 0, str(value.dtype), tuple(value.shape)), value)
    theirs: dict[int, bytes] = {}
    for q in peers:
        expect = announce(q, part)
        if expect:
            got = transport.recv(q, part, (-1, f"{SETUP}public", 0, "torch.uint8", (len(expect), width)))
            for i, row in zip(expect, got.numpy()):
                row = row.tobytes()
                if identities is not None:
                    identities.verify(salt, i, row[:PUBLIC], row[PUBLIC:], sender=f"process {q}")
                theirs[i] = row[:PUBLIC]
    transport.flush(part)
    known = {**theirs, **announced}

    # 2. pairwise secrets for every pair with a held end, bound to both public keys
    shared: dict[tuple[int, int], bytes] = {}
    for a, b in pairs:
        if a in mine or b in mine:
            me, other = (a, b) if a in mine else (b, a)
            try:
                raw = keys[me].exchange(X25519PublicKey.from_public_bytes(known[other]))
            except ValueError as exc:  # an all-zero (low-order) public key
                raise TransportError(f"agent {me}: the public key agent {other} sent is not usable ({exc})") from None
            shared[(a, b)] = pair_secret(raw, salt, a, b, known[a], known[b])
            if audit is not None:
                audit["raw"].append(raw)

    # 3. group secrets: the leader draws, wraps for every member under their wrapping key
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
            wrap = wrap_key(shared[(leader, m)], salt, leader, m)
            if audit is not None:
                audit["wrap"].append(wrap)
                audit.setdefault("nonces", []).append(nonce)
            outgoing[int(owner[m])].append(nonce + ChaCha20Poly1305(wrap).encrypt(nonce, secrets[g], _aad(g, m)))

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
                    secret = ChaCha20Poly1305(wrap_key(shared[(g[0], m)], salt, g[0], m)).decrypt(
                        blob[:NONCE], blob[NONCE:], _aad(g, m))
                except InvalidTag:
                    raise TransportError(f"agent {m}: the group secret of {list(g)} from agent {g[0]} failed "
                                         "authentication (a corrupted or forged setup message)") from None
                secrets.setdefault(g, secret)
    transport.flush(part)
    if audit is not None:
        audit["private"] = list(private.values())
    out = AgreedKeys(public=public, salt=salt, n=n, own=own, pairs=shared, groups=secrets, audit=audit)
    if store is not None:
        for i in held:
            store.save(i, out.export(i))
        transport.agree_max(part, 0)  # phase 1: every process has its agents' pending files
        store.commit(held)
        transport.agree_max(part, 0)  # phase 2: every file is final: only now may rounds run
    return out


def agree_alone(*, network, mechanism, public: KeySource, context: str,
                entropy: Callable[[str], bytes] | None = None, identities: Identities | None = None,
                store: str | os.PathLike | None = None, store_identity: dict | None = None,
                keep: bool = False) -> AgreedKeys:
    """Agreed keys of a run whose agents are all in this process (the simulator): the same derivation, every
    exchange local."""
    from privdl.comm.transport import Transport
    from privdl.placement import Placement

    n = network.n
    return agree(part=0, placement=Placement(n, tuple(range(n))), owner=np.zeros(n, dtype=np.int64),
                 network=network, groups=shared_groups(mechanism, n), transport=Transport(1), public=public,
                 context=context, entropy=entropy, identities=identities, store=store, store_identity=store_identity,
                 keep=keep)


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


__all__ = ["AgreedKeys", "THREAT_MODEL", "agree", "agree_alone", "needed_pairs", "pair_secret", "random_entropy",
           "salt_of", "seeded_entropy", "shared_groups", "threat_model", "wrap_key", "TEST_ENTROPY", "config_options",
           "keys_facts"]
