"""A run with agreed keys that stops and starts again releases nothing it had not released (issue 43).

The first attempt writes its agents' secrets (mode 0600) before any round and checkpoints every 3 rounds; it stops
after round 8, having released rounds 7 and 8 after its last checkpoint. Whatever starts it again — a resume from
round 6, a second resume of a copy of the same checkpoint, a start from round 0 without --resume — loads those
secrets, so rounds 7 and 8 are sent again byte for byte as the first time (what an eavesdropper saw is all there is)
and the results are one run's. Checkpoints and secret files that were edited, swapped, truncated or come from
another run are refused by name.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import stat

import pytest
import torch
from typer.testing import CliRunner

from privdl.algorithms import make_algorithm
from privdl.cli import app
from privdl.experiment.config import expand, load_config
from privdl.experiment.run_pipeline import run_one
from privdl.experiment.run_state import secrets_folder
from privdl.experiment.store import ResultStore
from privdl.keys import Keys, RootKeys
from privdl.mechanisms import make_mechanism
from privdl.network import Network
from privdl.agreement import TEST_ENTROPY, agree_alone
from privdl.agreement.keystore import KeyStoreError
from privdl.schedules import make_schedule
from privdl.simulator import simulate
from privdl.simulator.checkpoint import MAGIC, CheckpointError, Checkpoints, _write
from privdl.tasks import make_task
from tests.conftest import Stop, kill_after_first_checkpoint, stop_after

N, ROUNDS, EVERY, CUT = 5, 10, 3, 8


class Wire:
    """An eavesdropper on every link: each message's bytes by (round, tag)."""

    def __init__(self):
        self.seen: dict[tuple[int, str], list[bytes]] = {}

    def on_message(self, *, t, tag, src, dst, payload):
        self.seen.setdefault((t, tag), []).append(src.numpy().tobytes() + dst.numpy().tobytes()
                                                  + payload.cpu().numpy().tobytes())


def _engine(family):
    net = Network.from_topology("erdos_renyi", N, p=0.7, seed=2)
    task = make_task("logistic", N, dataset="breast_cancer", batch_size=8, seed=1)
    alg = make_algorithm("dsgd")
    steps = alg.accesses(ROUNDS, net.edges)
    extra = {"delta": 1e-5, "lot_size": 8} if family == "dp_sgd" else {}
    mech = make_mechanism(family, steps=steps, network=net, task=task, clip=1.0, epsilon=10.0, **extra)
    return net, task, alg, mech


@pytest.mark.parametrize("family", ["decor", "dp_sgd"])
def test_rounds_after_the_last_checkpoint_are_sent_again_byte_for_byte(tmp_path, family):
    """Fresh (operating-system) entropy: the first attempt's rounds 7 and 8 and the resumed attempt's are the same
    bytes on every link — DECOR's pairwise terms, an agent's own noise and its Poisson lot alike. A resume that agreed
    new keys would send new noise on the same data: each round then counts twice against ε, unledgered."""
    runs = []
    for attempt in range(2):
        net, task, alg, mech = _engine(family)
        source = agree_alone(network=net, mechanism=mech, public=RootKeys(3), context="run",
                             store=tmp_path / "keys")
        assert source.restored == (attempt == 1)
        ck = Checkpoints([tmp_path / "ck"], [{"run_id": "run", "config_digest": "c", "source": "s"}], n=N,
                         every=EVERY)
        wire = Wire()
        kw = dict(task=task, network=net, algorithm=alg, mechanism=mech, keys=Keys(source, N), iterations=ROUNDS,
                  schedule=make_schedule("constant", eta=0.05, iterations=ROUNDS), observers=[wire], checkpoints=ck)
        if attempt == 0:
            with pytest.raises(Stop):
                simulate(**kw, on_step=stop_after(CUT))
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "keys").iterdir()}
            assert modes == {f"agent-{i}.json": 0o600 for i in range(N)}
            ckmodes = {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "ck").rglob("*.pt")}
            assert ckmodes == {0o600}
        else:
            simulate(**kw, resume=True)
        runs.append(wire.seen)
    first, again = runs
    replayed = [k for k in again if k[0] <= CUT]
    assert {k[0] for k in replayed} == {7, 8}
    for k in replayed:
        assert again[k] == first[k], k


def _config(tmp_path, extra=""):
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "r"\niterations = 10\neval_every = 2\n[schedule]\neta = 0.05\n[network]\n'
                   'topology = "ring"\nn = 4\n[task]\nname = "logistic"\ndataset = "breast_cancer"\n'
                   '[mechanism]\nname = "decor"\nepsilon = 10.0\n[runtime]\ncheckpoint_every = 3\n'
                   'keys = "agreed"\n' + extra)
    return cfg


def _interrupted(tmp_path, cfg, out):
    store = ResultStore(out)
    spec = expand(load_config(cfg))[0][0]
    store.claim(load_config(cfg))
    with pytest.raises(Stop):
        run_one(spec, on_step=stop_after(CUT), checkpoints=store.run_dir(spec.run_id) / "checkpoints",
                secrets=secrets_folder(store.run_dir(spec.run_id)))
    return store, spec


def _rows(folder):
    return sorted(tuple(r.values()) for r in csv.DictReader(open(folder / "results.csv")))


def _run(*args):
    res = CliRunner().invoke(app, ["run", *map(str, args), "--no-plot", "--quiet"])
    return res


@pytest.mark.parametrize("backend", ["", 'backend = "sliced"\nslices = 2\n'], ids=["simulator", "sliced"])
def test_two_resumes_of_one_checkpoint_and_a_restart_give_one_run(tmp_path, backend):
    """`privdl run --resume` on two copies of one interrupted run's folder gives the same results.csv; starting the
    same folder over without --resume gives it too (the stored secrets replay rounds 1–8). The manifest says the
    secrets were restored; once saved, the run's secret files are gone and no secret is in any file it keeps."""
    cfg = _config(tmp_path, backend)
    store, spec = _interrupted(tmp_path, cfg, tmp_path / "first")
    stored = {p.name: p.read_bytes() for p in secrets_folder(store.run_dir(spec.run_id)).iterdir()}
    assert len(stored) == 4
    sealed = list((tmp_path / "first").rglob("agent-*.pt"))  # every agent file under its agent's HMAC
    assert len(sealed) == 8 and all(p.read_bytes().startswith(MAGIC + b"hmac-sha256:") for p in sealed)
    for name in ("a", "b", "c", "edited"):
        shutil.copytree(tmp_path / "first", tmp_path / name)
    edited = next((tmp_path / "edited").rglob("round-000000006")) / "agent-1.pt"
    _write(edited, _payload(edited))  # re-digested with SHA-256 (what anyone can compute)
    res = _run(cfg, "--out", tmp_path / "edited", "--resume")
    assert res.exit_code != 0 and "carries no HMAC" in " ".join(res.output.split())
    for name in ("a", "b"):
        res = _run(cfg, "--out", tmp_path / name, "--resume")
        assert res.exit_code == 0, res.output
    res = _run(cfg, "--out", tmp_path / "c")
    assert res.exit_code == 0, res.output
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b") == _rows(tmp_path / "c")
    man = json.loads((tmp_path / "a" / "runs" / spec.run_id / "manifest.json").read_text())
    assert man["keys"]["restored_from_store"] is True and man["checkpoints"]["resumed_from_round"] == 6
    assert not secrets_folder(tmp_path / "a" / "runs" / spec.run_id).exists()
    secrets = [bytes.fromhex(v) for blob in stored.values() for k, v in _secret_values(blob)]
    kept = b"".join(p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert secrets and not [s for s in secrets if s in kept or s.hex().encode() in kept]


def _secret_values(blob: bytes):
    data = json.loads(blob.partition(b"\n")[2])
    yield "own", data["own"]
    for k, v in [*data["pairs"].items(), *data["groups"].items()]:
        yield k, v


def test_with_seeded_entropy_the_resumed_run_equals_the_uninterrupted_one(tmp_path, monkeypatch):
    """With the test entropy set, every secret is a function of it: the interrupted-and-resumed run is the
    uninterrupted run, and the manifest says the secrets were not secret."""
    monkeypatch.setenv(TEST_ENTROPY, "11")
    cfg = _config(tmp_path)
    res = _run(cfg, "--out", tmp_path / "want")
    assert res.exit_code == 0, res.output
    _interrupted(tmp_path, cfg, tmp_path / "got")
    res = _run(cfg, "--out", tmp_path / "got", "--resume")
    assert res.exit_code == 0, res.output
    assert _rows(tmp_path / "got") == _rows(tmp_path / "want")
    man = json.loads(next((tmp_path / "got" / "runs").rglob("manifest.json")).read_text())
    assert "not secret" in man["keys"]["entropy"]


def test_no_secret_or_key_of_a_run_is_in_its_files_or_its_output(tmp_path, monkeypatch):
    """With the test entropy every secret of the run can be recomputed (agree again with keep=True): none of them —
    private keys, X25519 outputs, own, pairwise, wrapping and group secrets, the draws' and the checkpoints' keys,
    raw or in hex — is in any file an interrupted-and-resumed run leaves, nor in what the commands printed."""
    monkeypatch.setenv(TEST_ENTROPY, "23")
    cfg = _config(tmp_path)
    store, spec = _interrupted(tmp_path, cfg, tmp_path / "out")
    res = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "out"), "--resume", "--no-plot"])
    assert res.exit_code == 0, res.output
    from privdl.experiment.build import build
    from privdl.agreement import config_options

    c = build(spec.config)
    source = agree_alone(network=c.network, mechanism=c.mechanism, public=RootKeys(spec.config["seed"]),
                         context=spec.run_id, keep=True, **config_options(spec.config, 4, range(4)))
    keys = Keys(source, 4)
    for purpose in ("noise", "batch", "lot"):  # derive the draw keys the run used
        keys.own(purpose)
    for i in range(4):
        source.checkpoint_key(i)
    secrets = [s for s in source.secrets() if len(s) == 32]
    assert len(secrets) > 30
    kept = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()) + res.output.encode()
    leaked = [s.hex() for s in secrets if s in kept or s.hex().encode() in kept]
    assert not leaked, leaked


def test_a_run_that_lost_some_secrets_is_refused_not_agreed_again(tmp_path):
    """One agent's secret file is gone after rounds were released: the run stops, naming the file, instead of
    agreeing anew (which would release the rounds again under new noise)."""
    cfg = _config(tmp_path)
    store, spec = _interrupted(tmp_path, cfg, tmp_path / "out")
    lost = secrets_folder(store.run_dir(spec.run_id)) / "agent-2.json"
    lost.unlink()
    res = _run(cfg, "--out", tmp_path / "out", "--resume")
    assert res.exit_code != 0
    assert "agent 2" in res.output and "agent-2.json" in res.output and "released" in res.output


@pytest.mark.parametrize("damage,words", [
    ("swap", "holds agent 1's secrets, not agent 2's"),
    ("truncate", "agent-2.json of agent 2 is truncated or corrupt"),
    ("other_run", "is of another run"),
    ("other_source", "agent-0.json of agent 0 was written by a run with another source"),
    ("readable", r"agent-2.json of agent 2 may be read by other users \(mode 0644\)"),
], ids=["swap", "truncate", "other_run", "other_source", "readable"])
def test_a_bad_secret_file_is_refused_by_name(tmp_path, damage, words):
    """Another agent's file, a truncated one, another run's, one written by other privdl code (a replay would send
    the same noise on other values), one others may read: each refused, naming the file and the agent."""
    net, _, _, mech = _engine("decor")
    folder = tmp_path / "keys"
    agree_alone(network=net, mechanism=mech, public=RootKeys(3), context="run", store=folder,
                store_identity={"source": "a"})
    path = folder / "agent-2.json"
    if damage == "swap":
        shutil.copy(folder / "agent-1.json", path)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-10])
    elif damage == "readable":
        os.chmod(path, 0o644)
    context = "another" if damage == "other_run" else "run"
    with pytest.raises(KeyStoreError, match=words):
        agree_alone(network=net, mechanism=mech, public=RootKeys(3), context=context, store=folder,
                    store_identity={"source": "b" if damage == "other_source" else "a"})


def test_a_setup_that_stopped_before_every_file_was_final_agrees_anew(tmp_path):
    """Secrets are written in two phases: pending files, then (once every process has them) final names. A run that
    stopped while renaming — some files final, the others pending — released nothing (rounds start after every
    rename): it agrees anew, with new keys. A run where a final file is missing while others are final may have
    released rounds: refused."""
    net, _, _, mech = _engine("decor")
    folder = tmp_path / "keys"

    def agreed():
        return agree_alone(network=net, mechanism=mech, public=RootKeys(3), context="run", store=folder)

    first = agreed()
    os.replace(folder / "agent-3.json", folder / "agent-3.json.pending")
    again = agreed()
    assert not again.restored
    assert again.own("noise", [0])[0].tobytes() != first.own("noise", [0])[0].tobytes()
    assert sorted(p.name for p in folder.iterdir()) == [f"agent-{i}.json" for i in range(N)]
    assert agreed().restored
    (folder / "agent-3.json").unlink()
    with pytest.raises(KeyStoreError, match="agent 3 are missing here"):
        agreed()


# ---- checkpoints -------------------------------------------------------------------------------------------------
def _payload(path):
    blob = path.read_bytes()
    data = blob[len(MAGIC):].partition(b"\n")[2]
    return torch.load(io.BytesIO(data), weights_only=True)


@pytest.fixture
def interrupted(tmp_path):
    """A root-keyed and an agreed-key run, each stopped after round 8 with checkpoints at rounds 3 and 6."""
    out = {}
    for keys in ("root", "agreed"):
        net, task, alg, mech = _engine("decor")
        source = (RootKeys(3) if keys == "root" else
                  agree_alone(network=net, mechanism=mech, public=RootKeys(3), context="run",
                              store=tmp_path / keys / "keys"))
        folder = tmp_path / keys / "ck"
        ident = [{"run_id": "run", "config_digest": "c", "source": "s"}]

        def kw(net=net, task=task, alg=alg, mech=mech, source=source, folder=folder, ident=ident):
            return dict(task=task, network=net, algorithm=alg, mechanism=mech, keys=Keys(source, N),
                        iterations=ROUNDS, schedule=make_schedule("constant", eta=0.05, iterations=ROUNDS),
                        checkpoints=Checkpoints([folder], ident, n=N, every=EVERY))

        with pytest.raises(Stop):
            simulate(**kw(), on_step=stop_after(CUT))
        out[keys] = (kw, folder / "round-000000006")
    return out


@pytest.mark.parametrize("keys", ["root", "agreed"])
def test_a_checkpoint_with_edited_access_counts_is_refused_naming_the_field(interrupted, keys):
    """mechanism_calls edited and the file re-digested (SHA-256, which anyone can recompute): the ledger would state
    fewer accesses than the agent made. Refused in both modes — by the count the algorithm makes in 6 rounds, and in
    agreed mode first by the HMAC the editor cannot compute."""
    kw, where = interrupted[keys]
    path = where / "agent-1.pt"
    payload = _payload(path)
    payload["mechanism_calls"] -= 1
    _write(path, payload)
    words = "mechanism_calls = 5, but 6 rounds" if keys == "root" else "agent-1.pt of agent 1 carries no HMAC"
    with pytest.raises(CheckpointError, match=words):
        simulate(**kw(), resume=True)


def test_an_agreed_checkpoint_edited_or_swapped_fails_its_hmac(interrupted):
    """An agreed run's agent files are sealed under their agents' keys: a model value edited and re-sealed under a
    key the editor made up, or another agent's file in its place, is refused by name."""
    import hashlib
    import hmac as hmac_mod

    kw, where = interrupted["agreed"]
    path = where / "agent-3.pt"
    good = path.read_bytes()
    payload = _payload(path)
    payload["leaves"][0] = payload["leaves"][0] + 1e-3
    _write(path, payload, mac=hashlib.sha256(b"a guess").digest())
    with pytest.raises(CheckpointError, match="agent-3.pt fails its HMAC under agent 3's key"):
        simulate(**kw(), resume=True)
    shutil.copy(where / "agent-4.pt", path)
    with pytest.raises(CheckpointError, match="agent-3.pt fails its HMAC under agent 3's key"):
        simulate(**kw(), resume=True)
    path.write_bytes(good)
    assert hmac_mod is not None
    simulate(**kw(), resume=True)  # the untouched file resumes


def test_a_recorder_file_with_edited_counts_is_refused(interrupted):
    kw, where = interrupted["root"]
    path = where / "run.pt"
    payload = _payload(path)
    payload["counts"] += 1
    _write(path, payload)
    with pytest.raises(CheckpointError, match="run.pt: counts = "):
        simulate(**kw(), resume=True)


def test_secret_files_are_written_readable_by_their_owner_alone_whatever_the_umask(tmp_path):
    net, _, _, mech = _engine("decor")
    old = os.umask(0)
    try:
        agree_alone(network=net, mechanism=mech, public=RootKeys(3), context="run", store=tmp_path / "keys")
    finally:
        os.umask(old)
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "keys").iterdir()} == {0o600}


@pytest.mark.slow
def test_killed_processes_with_identities_resume_twice_to_one_run(tmp_path):
    """On processes, with identities: a 2-process agreed run killed (SIGKILL, every process) after a checkpoint;
    two `privdl run --procs 2 --resume` on two copies of its folder give the same results.csv — the rounds after the
    checkpoint were replayed from the stored secrets, not drawn anew — and the manifest says so, with the identity
    mode. Each process's secret and checkpoint files are its owner's alone while they exist."""
    res = CliRunner().invoke(app, ["keys", "generate", "--agents", "4", "--out", str(tmp_path / "ids")])
    assert res.exit_code == 0, res.output
    cfg = _config(tmp_path, 'identity = "ed25519"\nroster = "ids/roster.json"\nidentity_dir = "ids/identities"\n')
    cfg.write_text(cfg.read_text().replace("iterations = 10", "iterations = 600").replace("eval_every = 2",
                                                                                        "eval_every = 200")
                   .replace("checkpoint_every = 3", "checkpoint_every = 40"))
    out = tmp_path / "killed"
    kill_after_first_checkpoint(cfg, out)
    files = [*out.rglob("agent-*.json"), *out.rglob("agent-*.pt")]
    assert len(files) >= 8 and {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
    assert all(p.read_bytes().startswith(MAGIC + b"hmac-sha256:") for p in out.rglob("agent-*.pt"))
    for name in ("a", "b"):
        shutil.copytree(out, tmp_path / name)
        res = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / name), "--procs", "2", "--resume",
                                       "--no-plot", "--quiet"])
        assert res.exit_code == 0, res.output
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")
    man = json.loads(next((tmp_path / "a" / "runs").rglob("manifest.json")).read_text())
    assert man["keys"]["restored_from_store"] is True and man["keys"]["identity"] == "ed25519"
    assert man["checkpoints"]["resumed_from_round"] >= 40 and "process 0 receives" in man["keys"]["threat_model"].lower()
    assert not list((tmp_path / "a").rglob("agent-*.json"))  # the saved run's secrets are gone


def test_a_swapped_or_truncated_root_checkpoint_is_refused_naming_file_and_agent(interrupted):
    """Root keys (no HMAC): another agent's file in an agent's place is refused by its header, a truncated one by its
    digest — each naming the file."""
    kw, where = interrupted["root"]
    path = where / "agent-2.pt"
    good = path.read_bytes()
    shutil.copy(where / "agent-1.pt", path)
    with pytest.raises(CheckpointError, match=r"agent-2.pt is of another agent \(agent: 1, this run: 2\)"):
        simulate(**kw(), resume=True)
    path.write_bytes(good[:-40])
    with pytest.raises(CheckpointError, match="agent-2.pt is truncated or corrupt"):
        simulate(**kw(), resume=True)
