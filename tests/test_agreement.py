"""Agreed keys (runtime.keys = "agreed"): X25519 between the agents that share randomness, HKDF per purpose and
holders, group secrets wrapped with ChaCha20-Poly1305 (privdl.agreement).

What is checked against independent facts: the two ends of every edge derive the same key although each process
computes it alone (so DECOR's pairwise terms sum to zero over the network, to rounding); a Whisper group's members
draw the same seed noise (the sample covariance of the assembled noise is the designed R, within its sampling
error); no secret — private keys, shared secrets, group secrets, own secrets, the draws' 64-bit keys — appears in
any byte the transports or the rendezvous store carried, while the public keys (which must cross) do; with
deterministic entropy the run is the same on every placement, bit for bit.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from privdl.algorithms import make_algorithm
from privdl.comm.transport import Transport
from privdl.keys import KEY256, HeldKeys, Keys, RootKeys, fold, normal
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.placement import partition
from privdl.agreement import agree, agree_alone, seeded_entropy, shared_groups
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.sliced import owners_of, simulate_sliced
from privdl.tasks import make_task

N, ROUNDS = 6, 3


@pytest.fixture(scope="module")
def setup():
    net = Network.from_topology("erdos_renyi", N, p=0.6, seed=3)
    task = make_task("softmax", N, dataset="digits", partition="dirichlet", alpha=1.0, batch_size=8, seed=1)
    return net, task


def _mechanism(family, net, alg):
    steps = alg.accesses(ROUNDS, net.edges)
    if family == "pd_lms":
        return make_mechanism("none", steps=steps)
    return make_mechanism(family, steps=steps, network=net, clip=1.0, epsilon=20.0)


def _agree_all(net, mech, placements, entropy=None, transport=None):
    """Every slice's agreed key source, each agreeing in its own thread over one in-process transport."""
    from tests.conftest import agree_slices

    return agree_slices(net, shared_groups(mech, N), placements, entropy=entropy, transport=transport)


@pytest.mark.exact
@pytest.mark.parametrize("family", ["decor", "whisper", "pd_lms"])
def test_with_deterministic_entropy_an_agreed_run_is_the_same_on_every_placement(setup, family):
    """Agreed keys depend on the agents, never on where they run: the simulator (every exchange local) and 2, 3
    and n slices give the same run bit for bit (same operations on the same numbers, as tests/test_sliced.py) —
    and another run than the root-keyed one."""
    net, task = setup
    alg = make_algorithm("pd_lms", scheme="edge", variance=0.1) if family == "pd_lms" else make_algorithm("dsgd")
    mech = _mechanism(family, net, alg)
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    entropy = seeded_entropy(7)
    source = agree_alone(network=net, mechanism=mech, public=RootKeys(5), context="run", entropy=entropy)
    keys = Keys(source, N)
    want = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                    keys=keys, sparse=True, eval_every=1)
    for k in (2, 3, N):
        got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched,
                              iterations=ROUNDS, seed=5, slices=k, eval_every=1, agreed=True, context="run",
                              entropy=entropy)
        assert torch.equal(got.final, want.final), k
        assert got.records == want.records, k
        assert got.extra["setup_bytes"] > 0
    root = simulate(task=task, network=net, algorithm=alg, mechanism=mech, schedule=sched, iterations=ROUNDS,
                    seed=5, sparse=True)
    assert not torch.equal(root.final, want.final)


def _recover_key(v: np.ndarray, counter: int) -> int | None:
    """The attack on SplitMix64 draws (the review's): from two exactly observed normals of a draw at ``counter``,
    search the 11 bits Φ⁻¹'s input drops, invert SplitMix64's output function and the counter fold; the base key, or
    None."""
    from scipy.special import ndtr, ndtri

    from privdl.keys import _mix_int

    m64, gamma = (1 << 64) - 1, 0x9E3779B97F4A7C15

    def unshift(z, s):
        out = z
        for _ in range(64 // s + 1):
            out = z ^ (out >> s)
        return out & m64

    def unmix(z):
        z = (unshift(z, 31) * pow(0x94D049BB133111EB, -1, 1 << 64)) & m64
        z = (unshift(z, 27) * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & m64
        return unshift(z, 30)

    m0 = int(round((ndtr(v[0]) - 2**-54) * 2**53))
    for m in range(m0 - 64, m0 + 65):
        if ndtri(m * 2.0**-53 + 2.0**-54) != v[0]:
            continue
        for low in range(2048):
            fk = (unmix((m << 11) | low) - gamma) & m64
            if ndtri(((_mix_int((fk + 2 * gamma) & m64) >> 11) * 2.0**-53) + 2.0**-54) == v[1]:
                return unmix(fk) ^ _mix_int(((counter + 1) * gamma) & m64)
    return None


def test_256_bit_draws_do_not_give_their_keys_away():
    """With root keys (public anyway) two observed noise numbers give the draw's 64-bit key back — and with it the
    noise at every other counter. Agreed keys are 256-bit: the same observation of a draw from a key whose first
    64 bits are that same base key, folded by the same counter, gives nothing back (the attack finds no key whose
    SplitMix64 stream matches), and the draws still are standard normals."""
    base = 0x1234_5678_9ABC_DEF0
    v = normal(fold(np.uint64(base), 3), 8)[0].numpy()
    assert _recover_key(v, 3) == base  # the attack works where it should
    wide = np.array([np.void(base.to_bytes(8, "little") + bytes(24))], dtype=KEY256)
    w = normal(fold(wide, 3), 8)[0].numpy()
    assert not np.array_equal(v, w)
    assert _recover_key(w, 3) is None
    z = normal(fold(wide, np.arange(40)), 5000).reshape(-1)
    assert abs(float(z.mean())) < 5 / np.sqrt(z.numel()) and abs(float(z.var()) - 1) < 5 * np.sqrt(2 / z.numel())


def _assembled_noise(mech, placements, sources, counter, d, *, shared_only=False):
    """The network's noise at ``counter``: each slice draws its held rows from its own agreed keys
    (``shared_only``: without the agents' independent part)."""
    rows = []
    for p, src in zip(placements, sources):
        gen = copy.deepcopy(mech.noise)
        if shared_only:
            gen.sigma_mix = 0.0
        gen.bind(Keys(HeldKeys(src, p.held), N), "noise")
        rows.append((p.held_rows, gen.network(counter, d)[p.held_rows]))
    v = torch.zeros(N, d, dtype=torch.float64)
    for r, x in rows:
        v[r] = x
    return v


def test_agreed_keys_cancel_decor_and_give_whisper_its_covariance(setup):
    """Fresh (operating-system) entropy, 3 slices: DECOR's terms of every edge are drawn by its two ends from keys
    each derived alone, and sum to zero over the network (to rounding); a Whisper run's assembled noise has the
    designed covariance R = σ²I + FFᵀ (sample covariance over 40 000 coordinates within 6 standard errors of every entry)."""
    net, _ = setup
    alg = make_algorithm("dsgd")
    placements = partition(N, slices=3)
    decor = _mechanism("decor", net, alg)
    sources = _agree_all(net, decor, placements)
    assert np.abs(decor.noise.dense_factor().sum(0)).max() < 1e-12  # DECOR's design: 1ᵀF = 0 (each term ± once)
    v = _assembled_noise(decor, placements, sources, counter=4, d=2000, shared_only=True)
    scale = v.abs().max().item()
    assert scale > 0.1  # the agents' pairwise terms are large …
    assert v.sum(0).abs().max().item() < 1e-12 * N * scale  # … and cancel over the network
    for a, b in zip(*(t.tolist() for t in (net.edges.src, net.edges.dst))):  # both ends: the same edge key
        ka = sources[int(owners_of(placements, N)[a])].shared("probe", (a, b))
        kb = sources[int(owners_of(placements, N)[b])].shared("probe", (a, b))
        assert ka == kb
    whisper = _mechanism("whisper", net, alg)
    sources = _agree_all(net, whisper, placements)
    d = 40_000
    v = _assembled_noise(whisper, placements, sources, counter=0, d=d)
    r = whisper.noise.covariance()
    sample = (v @ v.T / d).numpy()
    err = np.sqrt((np.outer(np.diag(r), np.diag(r)) + r**2) / d)
    assert np.all(np.abs(sample - r) < 6 * err), np.max(np.abs(sample - r) / err)


def test_no_secret_crosses_the_in_process_transport(setup, monkeypatch):
    """Every byte sent between 3 slices of a DECOR and a Whisper run (headers, setup messages, payloads) is
    recorded: none of the slices' secrets is in it; the public keys are (the recorder sees the setup)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    net, task = setup
    wire: list[bytes] = []
    init = Transport.__init__

    def tapped(self, *a, **kw):
        init(self, *a, **kw)
        self.tap = wire.append

    monkeypatch.setattr(Transport, "__init__", tapped)
    alg = make_algorithm("dsgt")
    sched = make_schedule("constant", eta=0.1, iterations=ROUNDS)
    secrets, public = [], []
    for family in ("decor", "whisper"):
        got = simulate_sliced(task=task, network=net, algorithm=alg, mechanism=_mechanism(family, net, alg),
                              schedule=sched, iterations=ROUNDS, seed=5, slices=3, agreed=True, context=family,
                              keep_secrets=True)
        for src in got.extra["key_sources"]:
            secrets += src.secrets()
            public += [X25519PrivateKey.from_private_bytes(k).public_key().public_bytes(Encoding.Raw,
                                                                                         PublicFormat.Raw)
                       for k in src.private_keys]
    blob = b"".join(wire)
    assert len(blob) > 10_000 and len(secrets) > 50
    assert all(p in blob for p in public)
    leaked = [s.hex() for s in secrets if s in blob]
    assert not leaked, leaked


# ---- over gloo, with the rendezvous in a file store ----------------------------------------------------------------
def _dist_agree(rank, store_file, out):
    import datetime

    import torch.distributed as dist

    from privdl.runtime.transport import DistTransport

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=20))
    net = Network.from_topology("ring", N)
    alg = make_algorithm("dsgd")
    groups = sorted({*shared_groups(_mechanism("decor", net, alg), N), *shared_groups(_mechanism("whisper", net, alg),
                                                                                      N)})
    placements = partition(N, slices=2)
    t = DistTransport(rank, 2, [p.agents for p in placements], timeout=20)
    wire: list[bytes] = []
    t.tap = wire.append
    src = agree(part=rank, placement=placements[rank], owner=owners_of(placements, N), network=net, groups=groups,
                transport=t, public=RootKeys(1), context="dist", keep=True)
    keys = {g: src.shared("noise:probe", g) for g in groups if any(placements[rank].held[list(g)])}
    dist.barrier()
    store = open(store_file, "rb").read() if rank == 0 else b""
    out.put((rank, keys, src.secrets(), b"".join(wire), store, t.setup_bytes, int(t.payload_bytes.sum())))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_agreement_over_gloo_keeps_secrets_off_the_wire_and_the_store(tmp_path):
    """Two processes agree over gloo (rendezvous in a FileStore, so every byte the store holds can be read): each
    group's key is the same in both processes, and no secret is in the bytes either process sent nor in the
    store; the setup is counted as setup bytes, not payload."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=_dist_agree, args=(r, str(tmp_path / "store"), out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    got = sorted([out.get() for _ in range(2)], key=lambda g: g[0])
    (_, k0, s0, w0, store, setup0, payload0), (_, k1, s1, w1, _, setup1, payload1) = got
    common = set(k0) & set(k1)
    assert common and all(k0[g] == k1[g] for g in common)
    assert len(store) > 0 and len(w0) > 0 and len(w1) > 0
    blob = w0 + w1 + store
    leaked = [s.hex() for s in s0 + s1 if s in blob]
    assert not leaked, leaked
    assert setup0 > 0 and setup1 > 0 and payload0 == payload1 == 0


@pytest.mark.slow
def test_agreed_keys_in_a_config(tmp_path):
    """runtime.keys = "agreed" in the simulator, the sliced backend and on 2 processes: another run id than the
    root-keyed run, the manifest and the ledger name the key mode, setup bytes are reported apart."""
    import json

    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.errors import ConfigError
    from privdl.experiment import load_config

    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "agreed"\niterations = 6\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "logistic"\n'
                   'dataset = "breast_cancer"\n[mechanism]\nname = "decor"\nepsilon = 10.0\n[schedule]\neta = 0.1\n')
    runner = CliRunner()
    ids = {}
    for label, extra in (("root", []), ("sim", ["runtime.keys=\"agreed\""]),
                         ("sliced", ["runtime.keys=\"agreed\"", "runtime.slices=2"])):
        res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / label), "--no-plot", "--quiet",
                                  *sum((["--set", e] for e in extra), [])])
        assert res.exit_code == 0, res.output
        man = json.loads(next((tmp_path / label / "runs").rglob("manifest.json")).read_text())
        ids[label] = man["run_id"]
        mode = "root" if label == "root" else "agreed"
        assert man["privacy_ledger"][0]["keys"] == mode and man["seeds"]["keys"].startswith(mode)
    res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "dist"), "--no-plot", "--quiet", "--procs", "2",
                              "--set", "runtime.keys=\"agreed\""])
    assert res.exit_code == 0, res.output
    man = json.loads(next((tmp_path / "dist" / "runs").rglob("manifest.json")).read_text())
    assert man["placement"]["setup_bytes"] > 0 and man["privacy_ledger"][0]["keys"] == "agreed"
    assert ids["sim"] == ids["sliced"] == man["run_id"] != ids["root"]
    assert "threat model" in man["seeds"]["keys"].lower()
    with pytest.raises(ConfigError, match="runtime.keys must be one of root, agreed"):
        load_config(cfg, ["runtime.keys=\"shared\""])
