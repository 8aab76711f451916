"""Who writes what where (issue 44, item 4), two processes started as torchrun starts them (``python -m
privdl.runtime`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each with its own ``--out`` as on two hosts
without a shared folder: process 0's folder holds the results; process 1's holds only its agents' checkpoint files
while the run lasts, and none once the run is saved (before, they stayed for ever). A fast check of the removal
itself: an engine removes its own agents' files only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
CONFIG = '''name = "hosts"
seeds = [0]
iterations = 8
eval_every = 4
[runtime]
checkpoint_every = 2
[schedule]
eta = 0.05
[network]
topology = "ring"
n = 4
sparse = true
[task]
name = "quadratic"
[algorithm]
name = "dsgd"
[mechanism]
name = "none"
'''



def _two_hosts(cfg, outs, *, program=("-m", "privdl.runtime"), out_here=False):
    """Two processes started as torchrun starts them (static rendezvous on a free loopback port), process r with
    ``--out outs[r]`` (``out_here``: also in the environment as OUT_HERE, for the test scripts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(SRC), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if out_here:
            env["OUT_HERE"] = str(outs[rank])
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen([sys.executable, *program, str(cfg), "--out", str(outs[rank])],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs

def test_an_engine_removes_its_own_checkpoint_files_only(tmp_path):
    from privdl.simulator.checkpoint import Checkpoints

    folder = tmp_path / "checkpoints"
    for t in (2, 4):
        (folder / f"round-{t:09d}").mkdir(parents=True)
        for i in range(4):
            (folder / f"round-{t:09d}" / f"agent-{i}.pt").write_bytes(b"x")
    Checkpoints([folder], [{}], n=4, every=2, agents=[2, 3], writes_run=False).remove_held()
    left = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.pt"))
    assert left == [f"round-{t:09d}/agent-{i}.pt" for t in (2, 4) for i in (0, 1)]
    Checkpoints([folder], [{}], n=4, every=2, agents=[0, 1], writes_run=False).remove_held()
    assert not folder.exists()


@pytest.mark.slow
def test_hosts_without_a_shared_folder_leave_no_checkpoints_behind(tmp_path):
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(CONFIG)
    outs = [tmp_path / "host0", tmp_path / "host1"]
    procs = _two_hosts(cfg, outs)
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    assert (outs[0] / "results.csv").is_file() and "1 runs (1 executed" in said[0]
    assert not list(outs[0].rglob("*.pt")), "process 0's host kept checkpoint files"
    assert not list(outs[1].rglob("*.pt")), "process 1's host kept its agents' checkpoint files"
    assert not (outs[1] / "results.csv").exists()  # results are written by process 0 alone
    # the byte counts process 0 collects after the rounds (with each process's facts): a ring of 4 in blocks
    # {0, 1}, {2, 3} sends 4 of its 8 directed edges' messages across (1→2, 2→1, 3→0, 0→3), 2 from each process
    import json

    man = json.loads(next((outs[0] / "runs").rglob("manifest.json")).read_text())
    sent = man["bytes_per_tag"]["x"]["bytes_sent"]
    assert man["placement"]["payload_bytes"] * 2 == sent
    assert man["placement"]["payload_bytes_per_process"] == [sent // 4, sent // 4]
    assert man["placement"]["control_bytes"] > 0


def _experiment(iterations: int) -> dict:
    import tempfile

    from privdl.experiment import load_config

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "hosts.toml").write_text(CONFIG.replace("iterations = 8", f"iterations = {iterations}"))
        return load_config(Path(d) / "hosts.toml", ['runtime.backend="dist"'])


def _held_files(out: Path, iterations: int) -> None:
    """``out`` as a host's folder left by an interrupted run of the experiment with ``iterations``: its
    experiment.json and one agent's checkpoint file (no result: process 0 writes those elsewhere)."""
    from privdl.experiment.store import ResultStore

    ResultStore(out).claim(_experiment(iterations))
    f = out / "runs" / "someid" / "checkpoints" / "round-000000002" / "agent-3.pt"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"x")


def test_a_host_folder_holding_another_experiments_agent_files_is_refused(tmp_path):
    from privdl.errors import ConfigError
    from privdl.experiment.store import ResultStore

    _held_files(tmp_path / "host1", 8)
    with pytest.raises(ConfigError, match=r"host1 holds checkpoint or key files of a different experiment "
                                          r"\(config differs at: iterations\)"):
        ResultStore(tmp_path / "host1").claim(_experiment(9))
    ResultStore(tmp_path / "host1").claim(_experiment(8))  # the same experiment: joined (its run resumes)
    # nothing of the other experiment held (the files removed once its run was saved): taken over, with a warning
    for p in (tmp_path / "host1" / "runs").rglob("*.pt"):
        p.unlink()
    with pytest.warns(UserWarning, match="it now holds this one"):
        ResultStore(tmp_path / "host1").claim(_experiment(9))


def test_every_process_refuses_when_one_folder_holds_another_experiment(tmp_path, monkeypatch):
    """:func:`claim_outputs` on two processes, the maximum over them stood in for: the process whose folder holds
    the other experiment names it and the keys; the other names that process, and neither runs anything."""
    from privdl.errors import ConfigError
    from privdl.experiment.store import ResultStore
    from privdl.runtime import worker

    _held_files(tmp_path / "host1", 8)
    (tmp_path / "host0").mkdir()
    said = {}
    monkeypatch.setattr(worker, "all_max", lambda value, **_: max(value, said.get("peer", 0)))
    with pytest.raises(ConfigError, match=r"host1 holds .* different experiment \(config differs at: iterations"):
        worker.claim_outputs(ResultStore(tmp_path / "host1"), _experiment(9), 1, 2)
    said["peer"] = 2  # process 1 refused (rank + 1)
    with pytest.raises(ConfigError, match=r"process 1 of 2: its --out cannot hold this experiment"):
        worker.claim_outputs(ResultStore(tmp_path / "host0"), _experiment(9), 0, 2)
    said["peer"] = 0
    worker.claim_outputs(ResultStore(tmp_path / "host1"), _experiment(8), 1, 2)  # the same experiment: no error


@pytest.mark.slow
def test_a_host_whose_out_holds_another_experiment_is_refused_at_start(tmp_path):
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(CONFIG.replace("iterations = 8", "iterations = 9"))
    _held_files(tmp_path / "host1", 8)
    outs = [tmp_path / "host0", tmp_path / "host1"]
    procs = _two_hosts(cfg, outs)
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode != 0 for p in procs), said
    assert f"{outs[1]} holds checkpoint or key files of a different experiment (config differs at: iterations" \
        in said[1], said[1]
    assert "process 1 of 2: its --out cannot hold this experiment" in said[0], said[0]
    assert not (outs[0] / "runs").exists() or not list((outs[0] / "runs").iterdir())  # nothing ran
    assert (outs[1] / "runs" / "someid" / "checkpoints" / "round-000000002" / "agent-3.pt").is_file()  # kept


COLLECTIVES = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "reduce", "scatter",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier"}


def test_collectives_run_only_through_the_transports_guard():
    """Every torch.distributed collective of privdl is called in privdl/runtime/transport.py, where
    ``_collective`` turns a dead or hung peer into an error naming it: none elsewhere (the byte counts' all_reduce
    at the end of a run used to be bare: a peer dying there left gloo's raw error, or a wait for the timeout)."""
    import ast

    found = []
    for path in sorted((SRC / "privdl").rglob("*.py")):
        if path.relative_to(SRC).as_posix() == "privdl/runtime/transport.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVES \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in ("dist", "c10d"):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    assert not found, found


DIES_AT_THE_END = '''import os, sys
from privdl.runtime import __main__ as entry
from privdl.simulator.coordinator import Coordinator
if os.environ["RANK"] == "1":
    finals = Coordinator.finals
    def dying(*args, **kwargs):  # dies after the rounds, once its final counts are sent, before the byte counts
        finals(*args, **kwargs)
        os._exit(3)
    Coordinator.finals = dying
entry.main(sys.argv[1:])
'''


@pytest.mark.slow
def test_a_peer_dying_after_the_rounds_is_named_not_waited_for(tmp_path):
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(CONFIG.replace("[runtime]\n", "[runtime]\ntimeout = 30\n"))
    script = tmp_path / "dies.py"
    script.write_text(DIES_AT_THE_END)
    procs = _two_hosts(cfg, [tmp_path / "out"] * 2, program=[str(script)])
    import time

    began = time.monotonic()
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert procs[1].returncode == 3 and procs[0].returncode != 0, said
    assert time.monotonic() - began < 30 + 20, "process 0 waited past the timeout"  # (30 s: the run's timeout)
    assert "process 1" in said[0] and "died" in said[0], said[0]
    assert "Traceback" not in said[0], said[0]  # a named error, not gloo's raw one


def test_how_far_behind_another_process_can_be_and_what_a_process_may_prune():
    """:func:`lag` on graphs drawn by hand, and :func:`prune_before` against the rounds a process keeps."""
    import numpy as np

    from privdl.runtime.pruning import lag, prune_before

    def both_ways(pairs):
        src = [a for a, b in pairs] + [b for a, b in pairs]
        return np.array(src), np.array([b for a, b in pairs] + [a for a, b in pairs])

    ring = both_ways([(i, (i + 1) % 6) for i in range(6)])
    blocks = np.array([0, 0, 1, 1, 2, 2])  # three processes on a ring of 6: each one hop from both others
    assert [lag(*ring, blocks, k, 3) for k in range(3)] == [1, 1, 1]
    path = both_ways([(i, i + 1) for i in range(3)])  # a path of 4 agents, one per process: 0 - 1 - 2 - 3
    assert [lag(*path, np.arange(4), k, 4) for k in range(4)] == [3, 2, 2, 3]
    one_way = (np.array([0, 1, 2]), np.array([1, 2, 3]))  # directed 0 → 1 → 2 → 3: nothing reaches process 0
    assert lag(*one_way, np.arange(4), 3, 4) == 3 and lag(*one_way, np.arange(4), 0, 4) is None
    assert lag(*both_ways([(0, 1), (2, 3)]), np.array([0, 0, 1, 1]), 0, 2) is None  # two components
    # at the end of round 10, the others at most 1 round behind: rounds up to 8 are complete everywhere; the
    # newest 2 of them (6, 8) and the newer 10 stay
    assert prune_before([2, 4, 6, 8, 10], 10, 1, 2) == 6
    assert prune_before([2, 4, 6, 8, 10], 10, 3, 2) == 4  # up to 6 complete: 4 and 6 stay
    assert prune_before([2, 4], 4, 1, 2) is None  # one round known complete: nothing goes


PRINTS_ITS_ROUNDS = '''import os, sys
from privdl.runtime import __main__ as entry
from privdl.simulator.coordinator import Coordinator
finals = Coordinator.finals
def finals_seen(self, *args, **kwargs):  # after the last round, before the run is saved and its files removed
    folder = [p for p in os.environ["OUT_HERE"].split(os.pathsep)][0]
    import pathlib
    rounds = sorted(int(p.name.split("-")[1]) for p in pathlib.Path(folder).rglob("round-*") if any(p.iterdir()))
    print("ROUNDS", rounds, flush=True)
    return finals(self, *args, **kwargs)
Coordinator.finals = finals_seen
entry.main(sys.argv[1:])
'''


@pytest.mark.slow
def test_a_host_process_0_does_not_see_prunes_its_checkpoints_during_the_run(tmp_path):
    """Two processes, each its own --out, a ring of 4 in two blocks (each process one hop from the other),
    checkpoints every 2 of 12 rounds: at the end of the rounds process 1's folder holds its files of rounds 8, 10
    (the newest two known complete everywhere) and 12 — not 2 … 12 — and none once the run is saved."""
    cfg = tmp_path / "hosts.toml"
    cfg.write_text(CONFIG.replace("iterations = 8", "iterations = 12"))
    script = tmp_path / "prints.py"
    script.write_text(PRINTS_ITS_ROUNDS)
    outs = [tmp_path / "host0", tmp_path / "host1"]
    procs = _two_hosts(cfg, outs, program=[str(script)], out_here=True)
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    assert "ROUNDS [8, 10, 12]" in said[1], said[1]
    assert "ROUNDS [10, 12]" in said[0], said[0]  # process 0 prunes whole rounds as before (keep = 2)
    assert not list(outs[1].rglob("*.pt"))


@pytest.mark.parametrize("held,want", [
    ([[2, 4, 6, 8], [4, 6, 8], [8, 10]], 8),  # the newest round common to all (10 is on one host only)
    ([[2, 4, 6, 10], [4, 6, 8, 10], [6, 8]], 6),  # the newest of each differs: several passes
    ([[40, 80], [40, 120], [80, 120]], None),  # every pair shares a round, the three none
    ([[2, 4], [], [2, 4]], None),  # a host with nothing
    ([[], [], []], None),
])
def test_processes_agree_on_the_newest_round_every_one_of_them_has(held, want):
    """agreed_round over the in-process transport's largest-value agreement (one thread per process, each seeing
    only its own rounds) against the intersection computed here from all of them."""
    import threading

    from privdl.comm.transport import Transport
    from privdl.simulator.checkpoint import agreed_round

    common = set.intersection(*map(set, held))
    assert want == (max(common) if common else None)
    transport = Transport(len(held), timeout=10)
    got = [None] * len(held)

    def part(k):
        got[k] = agreed_round(held[k], lambda v: transport.agree_max(k, v))

    threads = [threading.Thread(target=part, args=(k,)) for k in range(len(held))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
    assert got == [want] * len(held)


def test_a_process_sees_the_rounds_its_own_files_complete(tmp_path):
    """held_rounds: its agents' files (and the recorder's, for the engine that writes it) — not the other host's."""
    from privdl.simulator.checkpoint import Checkpoints

    folder = tmp_path / "checkpoints"
    for t, agents, run in ((2, (2, 3), False), (4, (2,), False), (6, (0, 1, 2, 3), True), (8, (0, 1), False)):
        (folder / f"round-{t:09d}").mkdir(parents=True)
        for i in agents:
            (folder / f"round-{t:09d}" / f"agent-{i}.pt").write_bytes(b"x")
        if run:
            (folder / f"round-{t:09d}" / "run.pt").write_bytes(b"x")
    ck = Checkpoints([folder], [{}], n=4, every=2)
    assert ck.held_by([2, 3]).held_rounds() == [2, 6]
    assert ck.held_by([0, 1]).held_rounds() == [6, 8]
    assert ck.held_by([0, 1], writes_run=True).held_rounds() == [6]  # round 8 lacks the recorder's file
    with pytest.warns(UserWarning, match="resuming from round 6"):
        assert ck.latest() == 6  # the run's view (every agent): the same round


KILLED_AT_ROUND = '''import os, signal, sys
from privdl.runtime import __main__ as entry
from privdl.simulator.checkpoint import Checkpoints
save = Checkpoints.save
def save_then_die(self, state, **kwargs):
    save(self, state, **kwargs)
    if state.t >= int(os.environ["DIE_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
Checkpoints.save = save_then_die
entry.main(sys.argv[1:])
'''


@pytest.mark.slow
def test_hosts_without_a_shared_folder_resume_to_the_uninterrupted_run(tmp_path):
    """Two processes, each its own --out (two hosts, no shared folder), both killed once they saved their agents'
    files of round 6 of 12 (checkpoints every 2; process 0's recorder file of that round is not written yet):
    restarted with --resume, they agree on the newest round both hosts' files complete —
    each reading only its own folder — and write the simulator's results."""
    from privdl.experiment import run_experiment

    cfg = tmp_path / "hosts.toml"
    cfg.write_text(CONFIG.replace("iterations = 8", "iterations = 12").replace("eval_every = 4", "eval_every = 3"))
    script = tmp_path / "dies.py"
    script.write_text(KILLED_AT_ROUND)
    outs = [tmp_path / "host0", tmp_path / "host1"]
    os.environ["DIE_AT"] = "6"
    try:
        procs = _two_hosts(cfg, outs, program=[str(script)])
        said = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        del os.environ["DIE_AT"]
    assert all(p.returncode != 0 for p in procs), said
    assert list(outs[1].rglob("round-000000006/agent-3.pt")) and not list(outs[1].rglob("run.pt"))
    assert not (outs[0] / "results.csv").exists()

    def rounds(out, name):
        return {int(f.parent.name.split("-")[1]) for f in out.rglob(name)}

    common = rounds(outs[0], "run.pt") & rounds(outs[0], "agent-1.pt") & rounds(outs[1], "agent-3.pt")
    assert common and max(rounds(outs[1], "agent-3.pt")) == 6  # host 1 has a newer round than host 0 completes
    procs = _two_hosts(cfg, outs, program=("-m", "privdl.runtime", "--resume"))
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    import json

    from privdl.experiment import load_config

    man = json.loads(next((outs[0] / "runs").rglob("manifest.json")).read_text())
    assert man["checkpoints"]["resumed_from_round"] == max(common)
    run_experiment(load_config(cfg), tmp_path / "sim", progress=False)
    got = (outs[0] / "results.csv").read_text().splitlines()
    want = (tmp_path / "sim" / "results.csv").read_text().splitlines()
    assert len(got) == len(want) > 4
    import csv

    rows = [list(csv.DictReader(x)) for x in (got, want)]
    for a, b in zip(*rows):
        assert (a["metric"], a["iteration"]) == (b["metric"], b["iteration"])
        assert abs(float(a["value"]) - float(b["value"])) <= 1e-9 * max(1.0, abs(float(b["value"]))), (a, b)
    assert not list(outs[1].rglob("*.pt"))
