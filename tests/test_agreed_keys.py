"""Agreed keys as properties (issue 43): every draw of an agreed run comes from a 256-bit key that only its holders
can compute, and changes with everything that names it.

Each test states a property whose loss is a privacy failure, checked against facts the code does not restate:
RFC 7539's ChaCha20 test vectors; X25519's masking of a public key's top bit (RFC 7748 §5: two encodings, one shared
secret); which agent's entropy each secret may depend on; and every derivation an attacker can compute from public
data (salt, run id, W, public keys, agent ids, purposes). The mutants of benchmarks/mutation.py ("keys" class) are
killed here.
"""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import privdl.keys as keys_mod
from privdl.comm.transport import Transport
from privdl.keys import KEY256, Keys, RootKeys, fold, normal, stream, uniform
from privdl.network import Network
from privdl.placement import partition
from privdl.agreement import NONCE, WRAPPED, agree_alone, salt_of, seeded_entropy, wrap_key
from tests.conftest import agree_slices

N = 6
#: seed groups that share their leader and members (0 wraps three group secrets for 1: the nonces must differ)
GROUPS = [(0, 1, 2), (0, 1, 3), (0, 1, 4, 5), (1, 3, 5)]
PURPOSES = ["noise", "batch", "lot"]


@pytest.fixture(scope="module")
def net():
    return Network.from_topology("erdos_renyi", N, p=0.6, seed=3)


class _Mechanism:
    """A mechanism stand-in whose only shared draws are GROUPS (what agree_alone asks of a mechanism)."""

    def bind(self, env):
        for g in GROUPS:
            env.keys.shared("probe", g)


def _alone(net, entropy, context="run", keep=True):
    return agree_alone(network=net, mechanism=_Mechanism(), public=RootKeys(1), context=context, entropy=entropy,
                       keep=keep)


def _edges(net):
    e = net.edges
    return sorted({(min(a, b), max(a, b)) for a, b in zip(e.src.tolist(), e.dst.tolist()) if a != b})


def _hex_rows(t: torch.Tensor) -> set[bytes]:
    return {row.numpy().tobytes() for row in t}


# ---- the generator -----------------------------------------------------------------------------------------------
def test_draws_from_256_bit_keys_are_rfc_7539_chacha20():
    """The words of a 256-bit key's draw are ChaCha20's keystream under that key (RFC 7539, appendix A.1, test
    vectors 1–3: block 0 and block 1 of the all-zero key, block 1 of the key ending in 01) — an offset draw starts at
    its own block, not at block 0."""
    zero = np.array([np.void(bytes(32))], dtype=KEY256)
    one = np.array([np.void(bytes(31) + b"\x01")], dtype=KEY256)
    block0 = ("76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
              "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586")
    block1 = ("9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
              "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f")
    one_block1 = ("3aeb5224ecf849929b9d828db1ced4dd832025e8018b8160b82284f3c949aa5a"
                  "8eca00bbb4a73bdad192b5c42f73f2fd4e273644c8b36125a64addeb006c13a0")
    assert stream(zero, 8)[0].tobytes().hex() == block0
    assert stream(zero, 8, start=8)[0].tobytes().hex() == block1
    assert stream(zero, 5, start=11)[0].tobytes() == bytes.fromhex(block1)[24:64]
    assert stream(one, 8, start=8)[0].tobytes().hex() == one_block1


def test_a_long_draw_never_repeats_a_column_block(monkeypatch):
    """A row longer than a generation block is drawn block by block; each block continues the key's keystream
    (no two blocks of a row alike, and the row equals one long keystream)."""
    monkeypatch.setattr(keys_mod, "BLOCK", 64)
    key = fold(np.array([np.void(hashlib.sha256(b"k").digest())], dtype=KEY256), 5)
    u = uniform(key, 256)[0]
    blocks = [u[i:i + 64] for i in range(0, 256, 64)]
    assert all(not torch.equal(a, b) for a, b in itertools.combinations(blocks, 2))
    words = stream(key, 256)[0] >> np.uint64(11)
    assert torch.equal(u, torch.from_numpy(words.view(np.int64)).to(torch.float64) * 2.0**-53)


def test_agreed_draws_differ_across_counters_purposes_requesters_agents_and_holders(net):
    """Every component that names a draw changes it: the counter (else one round's noise would repeat the next's,
    and their difference remove it), the purpose (else lots and noise share a keystream), the requester (else a
    cross-gradient for one neighbour repeats another's), the agent, and the holders of a shared draw. All 256-bit."""
    source = _alone(net, seeded_entropy(3))
    keys = Keys(source, N)
    assert keys.own("noise").dtype == KEY256 and keys.own("noise", np.arange(3), np.arange(3)).dtype == KEY256
    draws = {(p, c): keys.normal(p, c, 16) for p in PURPOSES for c in range(4)}
    rows = [row.numpy().tobytes() for d in draws.values() for row in d]
    assert len(set(rows)) == len(rows) == len(PURPOSES) * 4 * N  # counters × purposes × agents: all distinct
    cross = keys.normal("noise", 2, 16, rows=np.zeros(N, dtype=np.int64), requesters=np.arange(N))
    assert len(_hex_rows(cross)) == N
    shared = [source.shared(p, h) for p in ("a", "b") for h in [(0, 1), *GROUPS]]
    assert all(k.dtype == KEY256 for k in shared) and len({k.tobytes() for k in shared}) == len(shared)
    k = np.array([source.shared("a", (0, 1))])
    assert len(_hex_rows(normal(fold(k, np.arange(5)), 8))) == 5
    for i in range(N):  # a draw one agent "shares" with itself is not its own draw
        assert source.shared("noise", (i,)).tobytes() != source.own("noise", [i])[0].tobytes()


def _entropy_with(root: int, agent: int, other: int):
    """Seeded entropy in which only what ``agent`` draws (its X25519 key, its own secret, the group secrets and
    nonces it draws as a leader) comes from another root."""
    base, changed = seeded_entropy(root), seeded_entropy(other)

    def draw(label: str) -> bytes:
        kind, _, rest = label.partition("/")
        first = int(rest.split("/")[0].split("-")[0])  # the agent, or a group's leader
        return changed(label) if first == agent else base(label)

    return draw


@pytest.mark.parametrize("agent", [0, 3])
def test_an_agreed_key_depends_on_its_holders_entropy_and_on_nothing_else(net, agent):
    """Change the randomness of one agent only: its own keys change, every pair it belongs to and every group it
    leads gets new keys — and no other key moves. A key derived from public data (salt, run id, W) or from another
    agent's secret would break one of the two."""
    a = _alone(net, seeded_entropy(5))
    b = _alone(net, _entropy_with(5, agent, 6))
    for p in PURPOSES:
        ka, kb = a.own(p, np.arange(N)), b.own(p, np.arange(N))
        for i in range(N):
            assert (ka[i].tobytes() == kb[i].tobytes()) == (i != agent), (p, i)
    for pair in _edges(net):
        same = a.shared("x", pair).tobytes() == b.shared("x", pair).tobytes()
        assert same == (agent not in pair), pair
    for g in GROUPS:
        same = a.shared("x", g).tobytes() == b.shared("x", g).tobytes()
        assert same == (g[0] != agent), g  # a group secret is its leader's draw, wrapped for the others
    for i in range(N):
        assert (a.checkpoint_key(i) == b.checkpoint_key(i)) == (i != agent)


def _public_candidates(net, context: str, publics: list[bytes], infos: list[str]) -> set[bytes]:
    """Every 32-byte value an attacker computes from public data alone: the salt, the run id, W's bytes, every
    public key and every pair of them, each through HKDF under every info string the derivations use (and the salt,
    or none), SHA-256 and BLAKE2b of the same inputs, and the values themselves."""
    salt = salt_of(context, net)
    e = net.edges
    w = b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in (e.src, e.dst, e.weight, e.self_weight))
    ikms = [salt, context.encode(), w, hashlib.sha256(w).digest(), b"", *publics,
            *(p + q for p, q in itertools.permutations(publics, 2))]
    out: set[bytes] = set()
    for ikm in ikms:
        out.add(ikm[:32])
        out.add(hashlib.sha256(ikm).digest())
        for info in infos:
            out.add(hashlib.sha256(ikm + info.encode()).digest())
            out.add(hashlib.blake2b(ikm + info.encode(), digest_size=32).digest())
            for s in (salt, None):
                out.add(HKDF(algorithm=hashes.SHA256(), length=32, salt=s, info=info.encode()).derive(ikm))
    return out


def test_no_agreed_key_is_computable_from_public_data(net):
    """Recompute from public data alone — the salt, the run id, W, every X25519 public key, agent ids and purposes,
    through every derivation the protocol uses — and find none of the run's secrets or draw keys."""
    context = "public-run"
    source = _alone(net, seeded_entropy(9), context=context)
    publics = [X25519PrivateKey.from_private_bytes(k).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
               for k in source.private_keys]
    for p in PURPOSES:  # derive the draw keys an audit then knows of
        source.own(p, np.arange(N))
        for h in [*_edges(net), *GROUPS]:
            source.shared(p, h)
    for i in range(N):
        source.checkpoint_key(i)
    infos = [f"privdl/v1/own/{p}/{i}" for p in PURPOSES for i in range(N)]
    infos += [f"privdl/v1/shared/{p}/{'-'.join(map(str, h))}" for p in PURPOSES for h in [*_edges(net), *GROUPS]]
    infos += [f"privdl/v1/{kind}/{a}-{b}" for kind in ("pair", "wrap") for a, b in _edges(net)]
    infos += [f"privdl/v1/checkpoint/{i}" for i in range(N)]
    candidates = _public_candidates(net, context, publics, infos)
    secrets = [s for s in source.secrets() if len(s) == 32]
    assert len(secrets) > 100  # private keys, X25519 outputs, own, pair, group, wrap, draw and checkpoint keys
    found = [s.hex() for s in secrets if s in candidates]
    assert not found, found
    # and the draws: none equals a draw from a candidate key
    real = _hex_rows(Keys(source, N).normal("noise", 1, 8))
    fake = np.array([np.void(c) for c in sorted(candidates) for _ in range(N)], dtype=KEY256)
    assert not real & _hex_rows(normal(fold(fold(fake, np.arange(len(fake)) % N), 1), 8))  # every requester


class _FlipTopBit(Transport):
    """A link that sets the top bit of the first public key slice ``src`` sends slice ``dst``: X25519 masks that bit
    (RFC 7748 §5), so both ends still compute the same raw secret — only the transcript differs."""

    def __init__(self, *a, src, dst, **kw):
        super().__init__(*a, **kw)
        self.src, self.dst, self.flipped = src, dst, False

    def send(self, src, dst, header, payload):
        if (src, dst) == (self.src, self.dst) and header[1].endswith("public") and not self.flipped:
            payload = payload.clone()
            self.flipped = True
            payload[0, 31] ^= 0x80
        super().send(src, dst, header, payload)


@pytest.mark.parametrize("direction", [(0, 1), (1, 0)], ids=["lower-end", "upper-end"])
def test_the_pair_secret_is_bound_to_both_public_keys(net, direction):
    """An attacker who changes a public key's encoding in transit leaves the raw X25519 secret as it was; a pair
    secret bound to the transcript (both public keys) then differs at its two ends — the exchange does not let the
    ends agree on a key over different transcripts, whichever end's key (the pair's lower or upper agent) was
    changed. Every pair the change does not touch agrees."""
    placements = partition(N, slices=2)
    src, dst = direction
    transport = _FlipTopBit(2, timeout=20, src=src, dst=dst)
    sources = agree_slices(net, [], placements, entropy=seeded_entropy(4), transport=transport, keep=True)
    mine, theirs = set(placements[src].agents), set(placements[dst].agents)
    cross = [p for p in _edges(net) if len(set(p) & mine) == 1 and len(set(p) & theirs) == 1]
    first = min(x for x in mine if any(x in p for p in cross))  # the first key the link carried
    assert transport.flipped and any(first in p for p in cross)
    for p in cross:
        ka, kb = sources[0].shared("x", p), sources[1].shared("x", p)
        assert (ka.tobytes() == kb.tobytes()) == (first not in p), p
    # the raw secrets did agree: recomputed from the private keys, both ends' X25519 outputs are equal
    priv = {i: X25519PrivateKey.from_private_bytes(seeded_entropy(4)(f"x25519/{i}")) for i in range(N)}
    for p in cross:
        pub = [priv[i].public_key() for i in p]
        assert priv[p[0]].exchange(pub[1]) == priv[p[1]].exchange(pub[0])


def test_keys_are_bound_to_the_mixing_weights(net, tmp_path):
    """The salt names the run and its W: the same run id and the same entropy on a W with one weight moved give other
    keys for every agent, pair and group, and secrets stored under one W are refused under the other."""
    from privdl.agreement.keystore import KeyStoreError

    w = net.dense().copy()
    a, b = _edges(net)[0]
    w[a, b] += 1e-9  # one edge's weight moved, W still symmetric and doubly stochastic
    w[b, a] += 1e-9
    w[a, a] -= 1e-9
    w[b, b] -= 1e-9
    moved = Network.from_matrix(w)
    a, b = _alone(net, seeded_entropy(3)), _alone(moved, seeded_entropy(3))
    assert a.salt != b.salt
    for i in range(N):
        assert a.own("noise", [i])[0].tobytes() != b.own("noise", [i])[0].tobytes()
    for h in [*_edges(net), *GROUPS]:
        assert a.shared("x", h).tobytes() != b.shared("x", h).tobytes()
    agree_alone(network=net, mechanism=_Mechanism(), public=RootKeys(1), context="run", store=tmp_path / "k")
    with pytest.raises(KeyStoreError, match="is of another run"):
        agree_alone(network=moved, mechanism=_Mechanism(), public=RootKeys(1), context="run", store=tmp_path / "k")


def test_a_pair_secret_is_not_the_raw_x25519_output(net):
    """The raw X25519 output is never used as a key: no secret or draw key equals it."""
    source = _alone(net, seeded_entropy(2))
    priv = {i: X25519PrivateKey.from_private_bytes(seeded_entropy(2)(f"x25519/{i}")) for i in range(N)}
    raws = {priv[a].exchange(priv[b].public_key()) for a, b in _edges(net)}
    for p in PURPOSES:
        for h in _edges(net):
            source.shared(p, h)
    kept = set(source.secrets()) - set(source._audit["raw"])
    assert raws and not raws & kept


class _Recording(Transport):
    """An in-process transport that keeps the group secrets' setup messages."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.wrapped: list[tuple[int, int, bytes]] = []

    def send(self, src, dst, header, payload):
        if header[1].endswith("groups"):
            self.wrapped += [(src, dst, row.numpy().tobytes()) for row in payload]
        super().send(src, dst, header, payload)


@pytest.mark.parametrize("entropy", [None, 8], ids=["os-entropy", "seeded"])
def test_group_secrets_are_wrapped_under_a_key_of_their_own_with_fresh_nonces(net, entropy):
    """Agent 0 leads three groups that all hold agent 1 (one pairwise wrapping key): every wrap has its own nonce
    (a repeated ChaCha20-Poly1305 nonce under one key gives away the XOR of two secrets and the MAC key). A wrap opens
    under the wrapping key derived for it — and under no pairwise secret, draw key or other secret of the run."""
    placements = partition(N, assignment=[[0], [1, 2, 3, 4, 5]])
    transport = _Recording(2, timeout=20)
    a, b = agree_slices(net, GROUPS, placements, transport=transport, keep=True,
                        entropy=None if entropy is None else seeded_entropy(entropy))
    boxes = [blob for src, dst, blob in transport.wrapped if src == 0]
    assert len(boxes) == sum(len(g) - 1 for g in GROUPS if g[0] == 0) and all(len(x) == WRAPPED for x in boxes)
    nonces = [x[:NONCE] for x in boxes]
    assert len(set(nonces)) == len(nonces)
    for g in GROUPS:  # the members' group keys agree
        if g[0] == 0:
            assert a.shared("x", g).tobytes() == b.shared("x", g).tobytes()
    pair = b.export(1)["pairs"][(0, 1)]
    right = wrap_key(pair, b.salt, 0, 1)
    box = next(x for x in boxes)  # the first wrap for agent 1 (group (0, 1, 2))
    aad = b"privdl/v1/group/0-1-2/1"
    assert ChaCha20Poly1305(right).decrypt(box[:NONCE], box[NONCE:], aad) == a._groups[(0, 1, 2)]
    wraps = set(a._audit["wrap"])
    others = [s for s in a.secrets() + b.secrets() if len(s) == 32 and s not in wraps]  # pair, own, group, draws
    assert pair in others and right not in others
    for key in others:
        with pytest.raises(InvalidTag):
            ChaCha20Poly1305(key).decrypt(box[:NONCE], box[NONCE:], aad)


def test_keys_and_draws_of_one_run_are_the_same_on_every_placement(net):
    """With given entropy, the simulator's source and every slice's derive the same 256-bit keys (what lets DECOR
    cancel and a Whisper group share its seed noise, whatever the placement)."""
    alone = _alone(net, seeded_entropy(6), context="test")
    for k in (2, 3):
        sources = agree_slices(net, GROUPS, partition(N, slices=k), entropy=seeded_entropy(6))
        owner = {i: s for s in sources for i in s.agents}
        for i in range(N):
            assert owner[i].own("noise", np.array([i]))[0].tobytes() == alone.own("noise", np.array([i]))[0].tobytes()
        for h in [*_edges(net), *GROUPS]:
            assert owner[h[0]].shared("y", h).tobytes() == alone.shared("y", h).tobytes()
            assert owner[h[-1]].shared("y", h).tobytes() == alone.shared("y", h).tobytes()


def test_every_agreed_key_is_256_random_bits(net):
    """No part of an agreed key is fixed or shared between keys: each of a key's four 64-bit words takes a new value
    in every key (a key padded out from 64 bits, or any constant word, would repeat)."""
    source = _alone(net, seeded_entropy(12))
    keys = [source.own(p, np.arange(N)) for p in PURPOSES]
    keys += [np.array([source.shared(p, h)]) for p in PURPOSES for h in [*_edges(net), *GROUPS]]
    keys += [fold(k, 7) for k in keys[:1]]
    words = np.concatenate([k.reshape(-1) for k in keys]).view(np.uint64).reshape(-1, 4)
    assert len(words) > 50
    for j in range(4):
        assert len(np.unique(words[:, j])) == len(words), j


def _manifests(tmp_path, label, *extra):
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "draws"\niterations = 4\nseeds = [0, 1]\n[network]\ntopology = "ring"\nn = 4\n[task]\n'
                   'name = "logistic"\ndataset = "breast_cancer"\n[mechanism]\nname = "decor"\nepsilon = 10.0\n'
                   '[schedule]\neta = 0.1\n[sweep]\n"mechanism.epsilon" = [5.0, 10.0]\n')
    from typer.testing import CliRunner

    from privdl.cli import app

    res = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / label), "--no-plot", "--quiet",
                                   *extra])
    assert res.exit_code == 0, res.output
    import json

    return [json.loads(p.read_text()) for p in (tmp_path / label / "runs").rglob("manifest.json")]


@pytest.mark.parametrize("backend", [[], ["--set", 'runtime.backend="sliced"', "--set", "runtime.slices=2"],
                                     pytest.param(["--procs", "2"], marks=pytest.mark.slow)],
                         ids=["simulator", "sliced", "processes"])
def test_an_agreed_run_draws_only_from_chacha20_with_256_bit_keys(tmp_path, backend):
    """End to end, as a user runs it: every number an agreed run draws (noise, lots, shared terms) comes from the
    ChaCha20 keystream of a 256-bit key — none from SplitMix64 or Philox, whose outputs give their 64-bit keys away —
    in the simulator, the sliced backend and on processes, for every run of a sweep (runs that would stack on the
    replica axis included: each agrees its own keys). A root-keyed run draws none from ChaCha20."""
    mans = _manifests(tmp_path, "agreed", "--set", 'runtime.keys="agreed"', *backend)
    assert len(mans) == 4
    for man in mans:
        draws = man["keys"]["draws"]
        assert draws["chacha20"] > 0 and draws["splitmix64"] == draws["philox"] == 0, draws
        assert man["keys"]["key_bits"] == 256 and man["batch"]["replicas"] == 1
    if not backend:
        for man in _manifests(tmp_path, "root"):
            assert man["keys"]["draws"]["chacha20"] == 0 and man["keys"]["draws"]["splitmix64"] > 0


def test_the_vectorised_chacha20_is_the_librarys(monkeypatch):
    """Many short keystreams at once come from a numpy ChaCha20 vectorised over keys (privdl.keys.chacha20_blocks);
    it gives OpenSSL's words (through the cryptography package) for random keys, block counters up to 2³² − 1 and
    nonces, and a draw is the same numbers whichever path computes it."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    rng = np.random.default_rng(7)
    keys = np.frombuffer(rng.bytes(32 * 50), dtype=KEY256)
    counters = rng.integers(0, 2**32, 50, dtype=np.uint64)
    counters[:2] = [0, 2**32 - 1]
    nonces = rng.integers(0, 2**32, (50, 3), dtype=np.uint64)
    got = keys_mod.chacha20_blocks(keys, counters, nonces)
    for i in range(50):
        nonce = int(counters[i]).to_bytes(4, "little") + nonces[i].astype("<u4").tobytes()
        want = Cipher(algorithms.ChaCha20(keys[i].tobytes(), nonce), mode=None).encryptor().update(bytes(64))
        assert got[i].tobytes() == want, i
    many = fold(keys[:20][None], np.arange(15, dtype=np.uint64)[:, None]).reshape(-1)  # 300 keys: vectorised
    assert len(many) >= keys_mod.VECTOR_KEYS
    for size, start in [(31, 0), (7, 13), (128, 5)]:
        fast = stream(many, size, start)
        monkeypatch.setattr(keys_mod, "VECTOR_KEYS", 10**9)
        assert np.array_equal(fast, stream(many, size, start)), (size, start)
        monkeypatch.undo()


@pytest.mark.parametrize("mechanism", ['name = "decor"\nepsilon = 10.0',
                                       'name = "dp_sgd"\nepsilon = 10.0\ndelta = 1e-5\nlot_size = 16'])
def test_an_agreed_run_makes_no_draw_outside_its_keys(tmp_path, monkeypatch, mechanism):
    """The draw counter sees only privdl.keys: a draw from torch's or numpy's global generator, or from a numpy
    generator seeded by the operating system, would escape it. During an agreed run (noise, lots, batches) the
    global generators' states do not move and no unseeded numpy generator is made."""
    from privdl.experiment import load_config
    from privdl.experiment.build import build
    from privdl.experiment.config import expand
    from privdl.experiment.run_pipeline import run_one

    cfg = tmp_path / "c.toml"
    cfg.write_text('iterations = 5\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "logistic"\n'
                   f'dataset = "breast_cancer"\nbatch_size = 8\n[mechanism]\n{mechanism}\n[schedule]\neta = 0.1\n'
                   '[runtime]\nkeys = "agreed"\n')
    spec = expand(load_config(cfg))[0][0]
    c = build(spec.config)
    real = np.random.default_rng

    def seeded_only(seed=None, *args, **kw):
        assert seed is not None, "an unseeded numpy generator during an agreed run"
        return real(seed, *args, **kw)

    monkeypatch.setattr(np.random, "default_rng", seeded_only)
    before_torch, before_np = torch.get_rng_state(), np.random.get_state()
    _, man = run_one(spec, components=c)
    assert torch.equal(torch.get_rng_state(), before_torch)
    after_np = np.random.get_state()
    assert before_np[0] == after_np[0] and np.array_equal(before_np[1], after_np[1]) and before_np[2:] == after_np[2:]
    assert man["keys"]["draws"]["chacha20"] > 0 and man["keys"]["draws"]["splitmix64"] == 0
