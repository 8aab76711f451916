"""The distributed runtime (torch.distributed, gloo, loopback): each process holds a slice of the agents.

Why bit for bit holds on any CPU: a process runs the sliced backend's engine (privdl.simulator.sliced.run_slice) —
the network frame, the simulator's kernels and shapes — and the transport delivers exactly the rows and per-edge
values the in-process one does (tests/test_sliced.py), byte for byte (gloo copies bytes; the header pins dtype and
shape). So the run equals the simulator's, and so do its metrics (computed by process 0 from the gathered rows as
the simulator computes them).
"""

from __future__ import annotations

import csv
import json
import time

import pytest
import torch

from privdl.comm.transport import TransportError

CONFIG = '''name = "dist"
seeds = [0]
iterations = 12
eval_every = 4
[schedule]
eta = 0.05
[network]
topology = "erdos_renyi"
n = 6
p = 0.6
seed = 1
sparse = true
[task]
name = "logistic"
dataset = "breast_cancer"
'''
LOTS = '{ name = "dp_sgd", lot_size = 20, noise_multiplier = 1.0 }'
METHODS = [("dsgd+decor", '{ name = "dsgd" }', '{ name = "decor", epsilon = 10.0 }'),
           ("dsgt+dp_sgd", '{ name = "dsgt" }', LOTS),
           ("dpdl+dp_sgd", '{ name = "dpdl" }', LOTS),
           ("central+ldp", '{ name = "central_sgd" }', '{ name = "gaussian_ldp", epsilon = 10.0 }'),
           ("authors+ldp", '{ name = "dsgd", form = "cta", gossip = "authors" }',  # (whisper refuses it: no W-mixing)
            '{ name = "ldp", epsilon = 10.0 }'),
           ("dsg_rms", '{ name = "dsg_rms" }', '{ name = "none" }'),
           ("dinno+ldp", '{ name = "dinno", primal_steps = 2 }', '{ name = "gaussian_ldp", epsilon = 10.0 }')]
SWEEP = "".join(f'[[sweep.method]]\nlabel = "{label}"\nalgorithm = {alg}\nmechanism = {mech}\n'
                for label, alg, mech in METHODS)


def _rows(folder):
    return sorted(tuple(v for k, v in r.items() if k != "run_id") for r in csv.DictReader(open(folder / "results.csv")))


#: how far a process's results may be from the simulator's. A process computes its agents' gradients on their rows
#: alone (held rows), so an elementwise kernel (sigmoid, exp, log) meets a row's values in another SIMD position — a
#: vector body or the loop's tail — and may round its last bit the other way: each such value differs by at most a
#: few ulps (u = 2^-53 ≈ 1.1e-16) and a lot sum of L ≤ 40 clipped terms (‖·‖ ≤ C = 1) by at most 40 · 4u ≈ 2e-14.
#: Twelve rounds of steps η = 0.05 on a loss whose curvature is at most β ≤ max‖x‖²/4 ≈ 8 (30 standardised
#: features) grow it at most (1 + ηβ)^12 ≈ 1.4^12 ≈ 60-fold, to ≈ 1e-12 on the models; a metric Lipschitz in the
#: models within a factor ~10 of its value moves it relatively by less than 1e-9 (consensus distances of ≈ 1e-5,
#: quadratic in the models' spread, the most sensitive). Everything else — which rows, keys, lots, messages, byte
#: counts — is exact: a key, a label or a count that differs fails.
REL, ABS = 1e-9, 1e-12


def _same_within_rounding(got, want):
    assert len(got) == len(want), (len(got), len(want))
    for a, b in zip(got, want):
        assert a[:-1] == b[:-1], (a, b)
        assert __import__("math").isclose(float(a[-1]), float(b[-1]), rel_tol=REL, abs_tol=ABS), (a, b)


@pytest.mark.slow
def test_a_run_on_processes_equals_the_simulator_to_rounding(tmp_path):
    """privdl run --procs 3 (3 processes on loopback) writes the simulator's results.csv, to rounding (REL: each
    process computes only its agents' rows):
    D-SGD + DECOR, DSGT + DP-SGD (lots agreed), DPDL (cross-gradients pulled and pushed), central SGD (the
    aggregator), the seed-004 authors' in-place gossip + LDP, DSG-RMS, DiNNO + LDP; the manifest names the
    placement (EDSG-RMS: the eavesdropper's test below)."""
    from typer.testing import CliRunner

    from privdl.cli import app

    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG + SWEEP)
    runner = CliRunner()
    want = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "sim"), "--set", "batch_replicas=1",
                               "--no-plot", "--quiet"])
    assert want.exit_code == 0, want.output
    for k in (3,):  # 2 processes: the kill-and-resume test below
        got = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / f"p{k}"), "--procs", str(k), "--no-plot"])
        assert got.exit_code == 0, got.output
        _same_within_rounding(_rows(tmp_path / f"p{k}"), _rows(tmp_path / "sim"))
        assert f"{len(METHODS)} runs ({len(METHODS)} executed, 0 already done) in " in " ".join(got.output.split())
    manifests = [json.loads(p.read_text()) for p in (tmp_path / "p3" / "runs").rglob("manifest.json")]
    assert len(manifests) == len(METHODS)
    for m in manifests:
        assert m["placement"]["backend"] == "dist" and m["placement"]["slices"] == [[0, 1], [2, 3], [4, 5]]
        assert m["placement"]["payload_bytes"] > 0


# ---- the transport, two processes on loopback ----------------------------------------------------------------------
def _pair(rank, port, scenario, out):
    import datetime

    import torch.distributed as dist

    from privdl.runtime.transport import DistTransport

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=3))
    t = DistTransport(rank, 2, [(0, 1), (2, 3)], timeout=3)
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    if rank == 1:
        if scenario == "dead":
            import os
            os._exit(0)  # dies without a word
        if scenario == "hung":
            time.sleep(4.5)
            return
        if scenario == "dtype":  # float32 bytes where float64 ones are expected
            x = x.float()
        t.send(1, 0, (5, "theta", 7, str(x.dtype), tuple(x.shape)), x)
        t.flush(1)
        time.sleep(1)
        return
    started = time.perf_counter()
    try:
        expect = ("torch.float64", (4, 3)) if scenario == "size" else ("torch.float64", (1, 3)) \
            if scenario == "long" else ("torch.float64", (2, 3))
        t.recv(1, 0, (5, "theta", 7, *expect))
        out.put(("ok", "", time.perf_counter() - started))
    except TransportError as exc:
        out.put(("error", str(exc), time.perf_counter() - started))


def _run_pair(scenario):
    import torch.multiprocessing as mp

    from privdl.runtime.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_pair, args=(r, port, scenario, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    if scenario == "long":
        return procs[0].exitcode
    return out.get()


@pytest.mark.parametrize("scenario,match", [
    ("dtype", r"process 0 \(agents 0, 1\) expected round 5, tag 'theta', message 7 \(torch.float64, shape \(2, 3\)\) "
              r"from process 1 \(agents 2, 3\), received round 5, tag 'theta', message 7 \(torch.float32"),
    ("size", r"expected .*shape \(4, 3\).* received .*shape \(2, 3\)"),
    ("dead", r"process 1 \(agents 2, 3\) (died|did not answer).* waiting for round 5, tag 'theta'"),
    ("hung", r"process 1 \(agents 2, 3\) did not answer within 3 s while waiting for round 5, tag 'theta'"),
])
@pytest.mark.slow
def test_the_transport_names_a_wrong_header_a_dead_and_a_hung_peer(scenario, match):
    """gloo would fill a wrong-sized buffer or reinterpret another dtype's bytes silently: the header refuses both,
    naming sender, receiver, tag and round. A dead peer and a silent one each stop the receiver within the timeout
    (3 s here) with an error naming the peer's agents, the round and the tag."""
    kind, message, seconds = _run_pair(scenario)
    assert kind == "error", message
    assert __import__("re").search(match, message), message
    assert seconds < 6


@pytest.mark.slow
def test_a_message_longer_than_expected_stops_the_receiver():
    """Header and payload travel as one gloo message into a buffer of the size the receiver expects; a longer one
    cannot be received into it: gloo aborts the receiving process ("Received data size doesn't match expected
    size") — it stops, it never reads past its buffer or goes on with a truncated value (the launcher then names
    the process that died)."""
    code = _run_pair("long")
    assert code is not None and code != 0, code


def test_bad_runtime_launches_are_refused(tmp_path):
    from privdl.errors import PrivdlError
    from privdl.runtime import launch

    cfg = tmp_path / "c.toml"
    cfg.write_text((CONFIG + SWEEP).replace("n = 6", "n = 3"))
    with pytest.raises(PrivdlError, match="4 processes for 3 agents"):
        launch(cfg, procs=4, out=tmp_path / "o")
    with pytest.raises(PrivdlError, match="--procs must be an integer >= 1"):
        launch(cfg, procs=0, out=tmp_path / "o")


@pytest.mark.slow
def test_killed_processes_resume_from_their_checkpoints_to_the_uninterrupted_run(tmp_path):
    """Every process of a 2-process run killed (SIGKILL) after a checkpoint; `privdl run --procs 2 --resume`
    continues from the last round every agent has and writes the simulator's results."""
    from typer.testing import CliRunner

    from tests.conftest import kill_after_first_checkpoint

    from privdl.cli import app

    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.replace("iterations = 12", "iterations = 600")
                   .replace("eval_every = 4", "eval_every = 200")
                   + '[algorithm]\nname = "dsgt"\n[mechanism]\nname = "decor"\nepsilon = 10.0\n'
                     '[runtime]\ncheckpoint_every = 40\n')
    out = tmp_path / "killed"
    kill_after_first_checkpoint(cfg, out)
    assert not (out / "results.csv").exists() or not _rows(out)
    runner = CliRunner()
    got = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--procs", "2", "--resume", "--no-plot"])
    assert got.exit_code == 0, got.output
    assert "1 runs (1 executed, 0 already done) in " in " ".join(got.output.split())  # the runner's summary line
    again = runner.invoke(app, ["run", str(cfg), "--out", str(out), "--procs", "2", "--no-plot"])
    assert again.exit_code == 0 and "1 runs (0 executed, 1 already done) in " in " ".join(again.output.split())
    want = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "sim"), "--no-plot", "--quiet"])
    assert want.exit_code == 0, want.output
    _same_within_rounding(_rows(out), _rows(tmp_path / "sim"))
    man = json.loads(next((out / "runs").rglob("manifest.json")).read_text())
    assert man["checkpoints"]["resumed_from_round"] >= 40


@pytest.mark.slow
def test_a_rendezvous_that_never_completes_stops_with_advice():
    """A worker whose master never answers stops within the timeout with the address, port and interface advice."""
    import subprocess
    import sys

    from privdl.runtime.launch import free_port

    code = ("from privdl.runtime.worker import init_process_group\n"
            f"init_process_group(rank=1, world=2, init_method='tcp://127.0.0.1:{free_port()}', timeout=2)\n")
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and time.perf_counter() - started < 40
    assert "could not join the others" in out.stderr and "MASTER_PORT" in out.stderr
    assert "GLOO_SOCKET_IFNAME" in out.stderr


def test_agents_per_process_and_the_transport_are_checked(tmp_path):
    """runtime.agents_per_process places contiguous blocks (and says how many processes that needs); NCCL is
    refused with the reason — two processes on one GPU, or not built — before any process starts."""
    from privdl.errors import ConfigError, PrivdlError, ValidationError
    from privdl.experiment import load_config
    from privdl.device import check_transport
    from privdl.runtime.launch import processes_for
    from privdl.runtime.worker import placements_for

    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG + SWEEP)
    with pytest.raises(ConfigError, match="runtime.agents_per_process places or joins processes"):
        load_config(cfg, ["runtime.agents_per_process=4"])
    c = load_config(cfg, ["runtime.agents_per_process=4", "runtime.backend=\"dist\""])
    assert processes_for(c) == 2
    assert [p.agents for p in placements_for(c, 6, 2)] == [(0, 1, 2, 3), (4, 5)]
    with pytest.raises(ValidationError, match="places 6 agents on 2 processes; 3 were started"):
        placements_for(c, 6, 3)
    with pytest.raises(ConfigError, match="agents_per_process and runtime.assignment"):
        load_config(cfg, ["runtime.agents_per_process=2", "runtime.assignment=[[0, 1, 2], [3, 4, 5]]",
                          "runtime.backend=\"dist\""])
    with pytest.raises(PrivdlError, match="needs one GPU per process: 2 processes, 1 GPU here"):
        check_transport({"transport": "nccl"}, 2, gpus=1)
    with pytest.raises(PrivdlError, match="not built yet"):
        check_transport({"transport": "nccl"}, 2, gpus=2)
    check_transport({"transport": "gloo"}, 8, gpus=0)
    with pytest.raises(ConfigError, match="runtime.transport must be one of gloo, nccl"):
        load_config(cfg, ["runtime.transport=\"mpi\""])
    with pytest.raises(PrivdlError, match="sees no CUDA device"):  # this machine: a CPU build of torch
        from privdl.runtime import launch

        launch(cfg, procs=2, out=tmp_path / "o", overrides=["device=\"cuda\"", "runtime.backend=\"dist\""])


@pytest.mark.slow
def test_the_eavesdropper_watches_a_distributed_run(tmp_path):
    """Seed 002's streaming task (D-SGD, EDSG-RMS) on 2 processes: every process sends its part of each transmission to process 0,
    whose eavesdropper sees the simulator's wire — results.csv, the eavesdropper's MSDs included, to rounding (REL);
    the wire is control traffic, not payload."""
    from pathlib import Path

    from typer.testing import CliRunner

    from privdl.cli import app

    text = (Path(__file__).resolve().parent.parent / "examples" / "rms_filtering.toml").read_text()
    example = tmp_path / "rms.toml"
    example.write_text(text.replace('"algorithm.name" = ["dsgd", "exact_diffusion", "dsg_rms", "edsg_rms", "pd_lms", '
                                    '"psgt"]', '"algorithm.name" = ["dsgd", "edsg_rms"]'))
    assert example.read_text() != text
    common = ["--set", "seeds=1", "--set", "iterations=60", "--set", "eval_every=20", "--set", "network.sparse=true",
              "--no-plot", "--quiet"]
    runner = CliRunner()
    want = runner.invoke(app, ["run", str(example), "--out", str(tmp_path / "sim"), "--set", "batch_replicas=1",
                               *common])
    assert want.exit_code == 0, want.output
    got = runner.invoke(app, ["run", str(example), "--out", str(tmp_path / "dist"), "--procs", "2", *common])
    assert got.exit_code == 0, got.output
    rows = _rows(tmp_path / "dist")
    _same_within_rounding(rows, _rows(tmp_path / "sim"))
    assert {"eavesdropper_msd", "bytes_sent"} <= {r[-2] for r in rows}
    man = json.loads(next((tmp_path / "dist" / "runs").rglob("manifest.json")).read_text())
    assert man["placement"]["control_bytes"] > 0 and man["placement"]["payload_bytes"] > 0


def _launch_check(rank, port, configs, source, out):
    import datetime

    import torch.distributed as dist

    import privdl
    from privdl.runtime.worker import check_same_launch

    if source[rank]:
        privdl._SOURCE_HASH = source[rank]  # this process's privdl "installed from other sources"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=20))
    try:
        check_same_launch(configs[rank], rank, 2)
        out.put((rank, "ok"))
    except Exception as exc:  # noqa: BLE001 - the message is the test's subject
        out.put((rank, f"{type(exc).__name__}: {exc}"))


def _check_pair(configs, source=(None, None)):
    import torch.multiprocessing as mp

    from privdl.runtime.launch import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_launch_check, args=(r, port, configs, source, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    return dict(out.get() for _ in range(2))


@pytest.mark.slow
def test_hosts_with_different_configs_or_sources_are_refused_at_rendezvous(tmp_path):
    """Every process compares process 0's config (less the keys that are paths on each host), privdl source and
    torch version with its own before any run: a difference stops every process, and the differing process names
    what differs (the config's keys with both values, or the versions); equal launches pass."""
    import privdl

    base = {"name": "x", "iterations": 10, "base_dir": "/host/a", "network": {"n": 4, "topology": "ring"},
            "runtime": {"backend": "dist", "procs": 2}}
    other = {**base, "iterations": 12, "base_dir": "/host/b", "network": {"n": 4, "topology": "erdos_renyi"}}
    same_elsewhere = {**base, "base_dir": "/elsewhere", "runtime": {"backend": "dist", "procs": 1}}
    got = _check_pair([base, same_elsewhere])
    assert got == {0: "ok", 1: "ok"}, got
    got = _check_pair([base, other])
    assert "iterations: 12 here, 10 at process 0" in got[1] and "network.topology: 'erdos_renyi' here" in got[1], got
    assert "base_dir" not in got[1] and got[0].startswith("PrivdlError: process 0 of 2: another process"), got
    got = _check_pair([base, base], source=(None, "0123456789abcdef"))
    assert f"privdl {privdl.__version__} (source 0123456789abcdef) here" in got[1] and "another process" in got[0], got
