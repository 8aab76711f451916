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


def test_a_workers_refusal_reaches_the_launcher_with_its_class_named_not_pickled():
    """A worker's refusal travels as ("refused", rank, "module:qualname", message); the launcher raises the privdl
    error class that names (any privdl module's: PluginError of privdl.plugins, CheckpointError of the simulator),
    with the message unchanged — and plain PrivdlError for a class outside privdl, one that is not a PrivdlError,
    or a name that resolves to nothing (a name is imported, never unpickled)."""
    from privdl.errors import PrivdlError, ValidationError
    from privdl.plugins import PluginError
    from privdl.runtime.launch import _refusal
    from privdl.simulator.checkpoint import CheckpointError

    for cls in (PluginError, CheckpointError, ValidationError):
        err = _refusal([(0, f"{cls.__module__}:{cls.__qualname__}", "why, word for word")])
        assert type(err) is cls and str(err) == "why, word for word"
    for name in ("os:PathLike", "privdl.runtime.launch:GRACE", "privdl.nothing:X", "privdl.errors:Nothing", "junk"):
        err = _refusal([(0, name, "m")])
        assert type(err) is PrivdlError and str(err) == "m"
