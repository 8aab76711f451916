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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outs = [tmp_path / "host0", tmp_path / "host1"]
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(SRC), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen([sys.executable, "-m", "privdl.runtime", str(cfg), "--out", str(outs[rank])],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    said = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], said
    assert (outs[0] / "results.csv").is_file() and "1 runs (1 executed" in said[0]
    assert not list(outs[0].rglob("*.pt")), "process 0's host kept checkpoint files"
    assert not list(outs[1].rglob("*.pt")), "process 1's host kept its agents' checkpoint files"
    assert not (outs[1] / "results.csv").exists()  # results are written by process 0 alone
