"""Check: torchrun's --max-restarts with checkpoints — a worker killed mid-run costs at most checkpoint_every rounds.

Starts ``torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m privdl.runtime CONFIG`` (with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: pytorch/pytorch#135712), SIGKILLs one worker once a checkpoint is complete,
lets torchrun restart both (they resume from the last round every agent has), and compares results.csv with the
simulator's run of the same config. About a minute on 2 cores (not in the test suite: tests/test_runtime.py kills
every process and resumes with --resume instead).

    python benchmarks/torchrun_restart.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_runtime import CONFIG as RUNTIME_CONFIG, _rows  # the runtime benchmark's run (D-SGD + DECOR, logistic)

CONFIG = RUNTIME_CONFIG.format(T=800, n=6) + "[runtime]\ncheckpoint_every = 40\n"


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        cfg, out = Path(d) / "c.toml", Path(d) / "dist"
        cfg.write_text(CONFIG)
        torchrun = Path(sys.executable).with_name("torchrun")
        env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        proc = subprocess.Popen([str(torchrun), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "-m",
                                 "privdl.runtime", str(cfg), "--out", str(out)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 180
        while time.time() < deadline and not any(out.rglob("run.pt")):
            time.sleep(0.05)
        workers = subprocess.run(["pgrep", "-f", f"privdl.runtime {cfg}"], capture_output=True, text=True).stdout
        victim = max(int(p) for p in workers.split() if int(p) != proc.pid)
        os.kill(victim, signal.SIGKILL)
        print(f"killed worker {victim} after a checkpoint; torchrun restarts the workers", flush=True)
        _, err = proc.communicate(timeout=300)
        if proc.returncode:
            raise SystemExit(f"torchrun failed:\n{err[-3000:]}")
        subprocess.run([sys.executable, "-c", "from privdl.cli import main; main()", "run", str(cfg), "--out",
                        str(Path(d) / "sim"), "--no-plot", "--quiet"], check=True, capture_output=True)
        man = json.loads(next((out / "runs").rglob("manifest.json")).read_text())
        same = _rows(out) == _rows(Path(d) / "sim")
        print(f"resumed from round {man['checkpoints']['resumed_from_round']}; results.csv equal to the "
              f"simulator's: {same}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
