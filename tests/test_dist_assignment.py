"""Bad input of issue 44: an assignment that leaves a process without the neighbours' messages it needs. A
process with no agent, an agent placed nowhere (its neighbours would wait for its messages) or twice, more or fewer
parts than processes are refused by name — before any process starts (the launcher) and, under torchrun, before any
run (every process, alike) — also when only one run of a ``[sweep]`` is affected. An assignment that covers every
agent once leaves nobody waiting: each process's receive plan is exactly its agents' in-neighbours held elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from privdl.errors import PrivdlError, ValidationError

CONFIG = '''name = "assign"
seeds = [0]
iterations = 2
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
[runtime]
backend = "dist"
'''


def _cfg(tmp_path, extra: str = "", overrides=()):
    from privdl.experiment import load_config

    path = tmp_path / "c.toml"
    path.write_text(CONFIG + extra)
    return load_config(path, list(overrides))


@pytest.mark.parametrize("assignment,world,match", [
    ("[[0, 1, 2, 3]]", 2, r"1 parts for 2 processes: process 1 would hold no agent"),
    ("[[0], [1], [2, 3]]", 2, r"3 parts for 2 processes: process 2 would not be started, and its agents' "
                              r"neighbours would never get their messages"),
    ("[[0, 1], [2]]", 2, r"misses agent 3"),
    ("[[0, 1], [1, 2, 3]]", 2, r"places agent 1 twice"),
])
def test_an_assignment_that_leaves_a_process_waiting_is_refused_before_any_run(tmp_path, assignment, world, match):
    from privdl.runtime.worker import check_placements

    cfg = _cfg(tmp_path, f"assignment = {assignment}\n")
    with pytest.raises(ValidationError, match=match):
        check_placements(cfg, world)


def test_more_processes_than_agents_and_a_swept_network_size_are_refused_naming_the_run(tmp_path):
    from privdl.runtime.worker import check_placements

    with pytest.raises(ValidationError, match=r"5 processes for 4 agents: every process must hold at least one"):
        check_placements(_cfg(tmp_path), 5)
    # one assignment over two network sizes: the n = 6 run would leave agents 4 and 5 nowhere
    cfg = _cfg(tmp_path, 'assignment = [[0, 1], [2, 3]]\n[sweep]\n"network.n" = [4, 6]\n')
    with pytest.raises(ValidationError, match=r"run network.n=6, seed=0: runtime.assignment misses agents 4, 5"):
        check_placements(cfg, 2)
    check_placements(_cfg(tmp_path, 'assignment = [[3], [0, 1, 2]]\n'), 2)  # uneven, covering: fine


def test_the_launcher_refuses_before_starting_a_process(tmp_path):
    from privdl.runtime import launch

    (tmp_path / "c.toml").write_text(CONFIG + "assignment = [[0, 1], [2, 3]]\n")
    with pytest.raises(PrivdlError, match=r"2 parts for 3 processes: process 2 would hold no agent"):
        launch(tmp_path / "c.toml", procs=3, out=tmp_path / "o")
    assert not (tmp_path / "o").exists()  # nothing started, nothing claimed


@pytest.mark.slow  # the privdl command and its workers: fresh interpreters importing torch
def test_the_privdl_command_refuses_in_its_workers_before_touching_a_file(tmp_path):
    """``privdl run --procs 3`` (a launcher without torch: its workers check the launch, launch()'s docstring) on an
    assignment of 2 parts: the launcher's error, word for word, the command's exit code for errors (2), and no
    --out folder — the workers refused before any claim."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "c.toml").write_text(CONFIG + "assignment = [[0, 1], [2, 3]]\n")
    src = Path(__file__).resolve().parents[1] / "src"
    got = subprocess.run([sys.executable, "-m", "privdl.cli", "run", str(tmp_path / "c.toml"), "--procs", "3",
                          "--out", str(tmp_path / "o"), "--no-plot", "--quiet"], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONPATH": str(src), "COLUMNS": "400"})
    text = " ".join((got.stdout + got.stderr).split())
    assert got.returncode == 2, text
    assert "error: run seed=0: runtime.assignment has 2 parts for 3 processes: process 2 would hold no agent" in text
    assert "process 0 of 3 failed" not in text and "Traceback" not in text, text
    assert not (tmp_path / "o").exists()


def test_a_covering_assignment_receives_exactly_its_agents_in_neighbours():
    """The receive plan of each process of an uneven assignment on a ring of 6, against the ring's neighbours
    written out by hand: process 0 holds agent 3 (neighbours 2, 4), process 1 agents 0, 1, 2 (neighbours 5 and
    3 outside), process 2 agents 4, 5 (neighbours 3 and 0 outside)."""
    from privdl.comm.sliced import SliceComm
    from privdl.experiment.build import build_network
    from privdl.placement import partition
    from privdl.simulator.sliced import owners_of

    net = build_network({"topology": "ring", "n": 6, "sparse": True}, 0)
    parts = partition(6, assignment=[[3], [0, 1, 2], [4, 5]])
    owner = owners_of(parts, 6)

    class Idle:
        parts = 3

    want = {0: {1: [2], 2: [4]}, 1: {0: [3], 2: [5]}, 2: {0: [3], 1: [0]}}
    for k, p in enumerate(parts):
        comm = SliceComm(net, p, k, owner, Idle())
        got = {q: comm.rows_in[q].tolist() for q in comm.peers if comm.rows_in[q].numel()}
        assert got == want[k], (k, got)
        assert np.array_equal(comm.read_rows.numpy(), np.array(sorted(set(p.agents) | {
            a for rows in want[k].values() for a in rows})))
