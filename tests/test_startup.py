"""The start and the end of privdl's own processes (issue 44, "Start-up ≤ 1.5× the anchor's"): what the ``privdl``
command does last. The imports a worker makes are tests/test_worker_imports.py's; the launcher's refusals
tests/test_dist_assignment.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: the privdl command with its command replaced by one that fails (typer ends with SystemExit either way); at exit,
#: after the command, how many objects the collector holds frozen (the exit collections skip them)
COMMAND = """
import atexit, gc, sys
import privdl.cli as cli
atexit.register(lambda: print("frozen", gc.get_freeze_count()))
def command():
    import json  # some objects to hold
    raise SystemExit(3)
cli.app = command
cli.main()
"""


@pytest.mark.slow  # a fresh interpreter
def test_the_privdl_command_freezes_its_objects_before_it_exits():
    """privdl.cli.main ends with privdl.process_defaults.before_exit, also when the command exits with an error
    code: the objects are frozen by the time the interpreter's exit runs (its collections, over torch's objects,
    took 1.2–1.5 s per process: BENCHMARKS.md), and the command's exit code is kept."""
    out = subprocess.run([sys.executable, "-c", COMMAND], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 3, out.stderr
    frozen = int(out.stdout.split()[-1])
    assert frozen > 1000, out.stdout  # the interpreter's and the command's modules: thousands of objects
