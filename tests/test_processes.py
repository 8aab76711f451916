"""The distributed runtime's processes (issue 43, findings 4 and 8): nothing received over the network is unpickled;
workers die with their launcher; a hung or dead worker stops ``privdl run --procs K`` within ``runtime.timeout`` and
a few seconds, naming it, and stops the rest; two launches on one ``--out`` never run a run twice and end with the
runner's summary line; a torchrun restart works with the documented command; RANK / WORLD_SIZE / LOCAL_RANK are
checked before anything starts.

Process tests run real processes on loopback (gloo); each starts 2-3 Python processes that import torch (≈ 5 s each
on 2 busy cores), so their bounds allow for a slow machine while staying far below what the failures they catch
cost (a launcher that waits in join() waits for ever; an orphan runs to the end of its run)."""

from __future__ import annotations

import ast
import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_runtime import _same_within_rounding

#: every test here starts processes: the slow tier (README)
pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[1] / "src" / "privdl"
PYTHON = sys.executable
#: torch.distributed's object collectives: each pickles what it sends and unpickles what it receives
OBJECT_CALLS = ("broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
                "send_object_list", "recv_object_list")

CONFIG = '''name = "procs"
seeds = [0]
iterations = {T}
eval_every = {T}
[schedule]
eta = 0.05
[network]
topology = "ring"
n = 4
sparse = true
[task]
name = "logistic"
dataset = "breast_cancer"
[algorithm]
name = "dsgd"
[mechanism]
name = "decor"
epsilon = 10.0
[runtime]
timeout = {timeout}
'''


def _config(tmp_path: Path, T: int = 40, timeout: float = 20, extra: str = "") -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(T=T, timeout=timeout) + extra)
    return cfg


def _rows(folder: Path) -> list:
    return sorted(tuple(v for k, v in r.items() if k != "run_id") for r in csv.DictReader(open(folder / "results.csv")))


# ---- /proc helpers (Linux) ------------------------------------------------------------------------------------------
def _state(pid: int) -> str | None:
    """The process's state letter (R, S, T, Z …), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z", "X")


def _workers(launcher: int) -> list[int]:
    """The launcher's worker processes (spawned children running multiprocessing's spawn_main)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher and b"spawn_main" in cmd:
            out.append(int(d.name))
    return sorted(out)


def _start(cfg: Path, out: Path, procs: int = 2, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-c", "from privdl.cli import main; main()", "run", str(cfg), "--procs",
                             str(procs), "--out", str(out), "--no-plot", *extra], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _running(proc: subprocess.Popen, out: Path, procs: int, deadline: float = 90) -> list[int]:
    """Wait until the launch's workers are inside a run (process 0 holds a run's lock); their pids."""
    end = time.time() + deadline
    while time.time() < end:
        pids = _workers(proc.pid)
        if len(pids) == procs and any((out / "runs").glob("*/.lock")):
            return pids
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.05)
    raise AssertionError("the workers did not start a run in time")


def _cleanup(proc: subprocess.Popen, pids: list[int]) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ---- finding 4: no pickle on any network path -----------------------------------------------------------------------
def test_no_object_collective_or_unpickling_in_the_sources():
    """No call (an attribute or a name, not a word in a docstring) of torch.distributed's object collectives anywhere
    in privdl; no pickle, marshal or torch.load in the runtime and the key agreement (what the processes exchange over
    TCP)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        runtime = bool({"runtime", "agreement"} & set(path.relative_to(SRC).parts))
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in OBJECT_CALLS or (runtime and name in ("pickle", "marshal", "dill", "cloudpickle")):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {name}")
            if runtime and isinstance(node, ast.Attribute) and node.attr == "load" and \
                    isinstance(node.value, ast.Name) and node.value.id == "torch":
                found.append(f"{path.relative_to(SRC)}:{node.lineno} torch.load")
            if runtime and isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                if any(n and n.split(".")[0] in ("pickle", "marshal", "dill", "cloudpickle") for n in names):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} import {names}")
    assert not found, found


def _guarded_worker(*args):
    """A launcher worker in which every object collective and every unpickling raises."""
    import pickle

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def refuse(*_, **__):
        raise AssertionError("pickle on the network: an object collective or an unpickling was called")

    for name in OBJECT_CALLS:
        setattr(dist, name, refuse)
        setattr(c10d, name, refuse)
    c10d._object_to_tensor = c10d._tensor_to_object = refuse
    pickle.loads = pickle.load = refuse
    from privdl.runtime.launch import _worker

    _worker(*args)


def test_a_distributed_run_calls_no_object_collective_and_unpickles_nothing(tmp_path):
    """A real 2-process run (resumed, so the resume decision is exchanged too, and with a second run that is already
    done) in processes where torch.distributed's object collectives and pickle's loads raise: it completes, equal
    to the run without the guard."""
    import torch.multiprocessing as mp

    from privdl.runtime.launch import reserve_port, supervise

    cfg = _config(tmp_path, T=20, extra="checkpoint_every = 10\n")
    ctx = mp.get_context("spawn")
    messages = ctx.SimpleQueue()
    listener = reserve_port()
    port = listener.getsockname()[1]
    out = tmp_path / "guarded"
    workers = [ctx.Process(target=_guarded_worker, args=(r, 2, port, str(cfg), ['runtime.backend="dist"'], str(out),
                                                          True, 1, messages, False, os.getpid(), False,
                                                          listener if r == 0 else None))
               for r in range(2)]
    for w in workers:
        w.start()
    listener.close()
    summary, errors, stopped, _ = supervise(workers, messages)
    assert not errors and not stopped, errors
    assert [w.exitcode for w in workers] == [0, 0]
    assert summary["executed"] == 1 and summary["runs"] == 1
    assert _rows(out)


def test_the_rendezvous_port_is_held_from_its_choice_until_process_0_serves_on_it():
    """A launch's rendezvous port (reserve_port) cannot be taken by another program between its choice and the
    rendezvous — free_port released it at once, so a concurrent launch (or any program binding an ephemeral port)
    could take it before process 0 bound it — and a TCP store served on the held socket (master_listen_fd, as
    process 0 does) answers a client that connects to the port."""
    import datetime
    import socket

    import torch.distributed as dist

    from privdl.runtime.launch import free_port, reserve_port

    listener = reserve_port()
    port = listener.getsockname()[1]
    with socket.socket() as thief:
        with pytest.raises(OSError):
            thief.bind(("127.0.0.1", port))
    with socket.socket() as thief:  # what free_port hands out is free for anyone to take
        taken = free_port()
        thief.bind(("127.0.0.1", taken))
    wait = datetime.timedelta(seconds=10)
    server = dist.TCPStore("127.0.0.1", port, None, is_master=True, master_listen_fd=listener.detach(), timeout=wait,
                           wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=wait)
    client.set("privdl", "held")
    assert server.get("privdl") == b"held"


def test_a_worker_gives_up_on_a_reserved_port_nobody_serves_within_its_timeout():
    """Process 0 hung before serving the store on the launcher's reserved port: another worker's rendezvous fails
    within runtime.timeout (2 s here), naming the launcher's rendezvous — the reserved socket is bound, not listening,
    so the connection is refused and retried until the deadline (a listening one would queue it, and torch's store
    client then waits for the handshake's answer without a deadline: the launch hung)."""
    code = ("import time\n"
            "from privdl.runtime.launch import reserve_port\n"
            "from privdl.runtime.worker import init_process_group\n"
            "held = reserve_port()\n"
            "t0 = time.perf_counter()\n"
            "try:\n"
            "    init_process_group(rank=1, world=2, init_method=None, timeout=2, port=held.getsockname()[1])\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__, round(time.perf_counter() - t0), exc)\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    assert got.returncode == 0, got.stderr[-2000:]
    name, seconds, message = got.stdout.split(" ", 2)
    assert name == "PrivdlError" and int(seconds) < 30, got.stdout
    assert "the launcher's rendezvous on 127.0.0.1:" in message and "process 0, which serves it" in message


@pytest.mark.slow
def test_the_launch_keeps_its_port_from_other_programs_until_its_run_ends(tmp_path, monkeypatch):
    """While `launch` starts its workers (imports, config, rendezvous: seconds), a program that tries every 10 ms to
    bind the port the launch chose never gets it — process 0 serves the store on the launcher's socket — and the run
    completes."""
    import importlib
    import socket
    import threading

    launching = importlib.import_module("privdl.runtime.launch")  # the module (privdl.runtime.launch is the function)

    reserve, taken, stop = launching.reserve_port, [], threading.Event()

    def thief(port):
        end = time.perf_counter() + 3.0
        while time.perf_counter() < end and not stop.is_set():
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                    taken.append(port)
                    return
                except OSError:
                    pass
            time.sleep(0.01)

    def watched():
        held = reserve()
        threading.Thread(target=thief, args=(held.getsockname()[1],), daemon=True).start()
        return held

    monkeypatch.setattr(launching, "reserve_port", watched)
    cfg = _config(tmp_path, T=20)
    summary = launching.launch(cfg, procs=2, out=tmp_path / "o", overrides=['runtime.backend="dist"'])
    stop.set()
    assert summary.executed == 1 and not taken


# ---- finding 8: workers die with the launcher; a hung or dead worker stops the launch -------------------------------
def test_workers_die_with_their_launcher(tmp_path):
    """SIGKILL the launcher of `privdl run --procs 2` in the middle of a long run: its workers are gone within
    seconds (a parent-death signal), not at the end of the run."""
    cfg = _config(tmp_path, T=200000)
    out = tmp_path / "o"
    proc = _start(cfg, out)
    pids = []
    try:
        pids = _running(proc, out, 2)
        os.kill(proc.pid, signal.SIGKILL)  # the launcher only
        proc.wait()
        killed = time.perf_counter()
        while any(_alive(p) for p in pids) and time.perf_counter() - killed < 10:
            time.sleep(0.01)
        gone = time.perf_counter() - killed
        print(f"workers gone {gone:.2f} s after the launcher was killed")
        assert not any(_alive(p) for p in pids), "the workers outlived their launcher"
        assert gone < 5
    finally:
        _cleanup(proc, pids)


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_a_hung_or_dead_worker_stops_the_launch_and_is_named(tmp_path, how):
    """SIGSTOP (hung) or SIGKILL (dead) one worker of `privdl run --procs 2` in the middle of a run: the launcher
    exits with an error within runtime.timeout + a few seconds (GRACE, then SIGKILL for the rest), its message
    names the silent process, and no worker is left."""
    from privdl.runtime.launch import GRACE

    timeout = 4.0
    cfg = _config(tmp_path, T=200000, timeout=timeout, extra="checkpoint_every = 50\n")
    out = tmp_path / "o"
    proc = _start(cfg, out, 2)
    pids = []
    try:
        pids = _running(proc, out, 2)
        end = time.time() + 90  # inside the rounds: a checkpointed round is complete (however long the start-up)
        while not any(out.rglob("run.pt")) and time.time() < end:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.05)
        victim = pids[1]
        os.kill(victim, signal.SIGSTOP if how == "stopped" else signal.SIGKILL)
        hit = time.perf_counter()
        text, _ = proc.communicate(timeout=timeout + GRACE + 40)
        took = time.perf_counter() - hit
        text = " ".join(text.split())  # the console wraps long lines
        print(f"{how}: the launcher ended {took:.1f} s after the signal (timeout {timeout:g} s)\n{text[-1500:]}")
        assert proc.returncode != 0
        assert all(not _alive(p) for p in pids), "a worker outlived the failed launch"
        if how == "stopped":
            assert re.search(rf"process \d \(agents? [\d, ]+\) did not answer within {timeout:g} s", text), text
            assert "the launcher stopped process" in text, text
            assert took < timeout + GRACE + 8
        else:
            assert re.search(r"process \d of 2 was killed \(SIGKILL", text), text
            assert re.search(r"process \d \(agents? [\d, ]+\) died", text), text
            assert took < GRACE + 8
        assert "Traceback" not in text
    finally:
        _cleanup(proc, pids)


def test_a_worker_error_is_reported_not_the_errors_it_caused():
    """The launcher's choice of message: a process's own error before the transport errors it caused; a killed
    process and what its peers said; a hung process through its peers' message; the stopped processes named."""
    from privdl.runtime.launch import failure

    caused = (0, "TransportError: process 0 (agents 0, 1): process 1 (agents 2, 3) died (its connection closed)", "")
    own = (1, "ValueError: bad value", "Traceback …")
    assert str(failure(3, [caused, own], [1, 1, -15], [2])).startswith("process 1 of 3 failed: ValueError: bad value")
    text = str(failure(2, [caused], [1, -9], []))
    assert text.startswith("process 1 of 2 was killed (SIGKILL") and "process 0 said: TransportError" in text
    hung = (0, "TransportError: process 0 (agents 0, 1): process 1 (agents 2, 3) did not answer within 4 s", "")
    caused_2 = (2, "TransportError: process 2 (agents 4, 5): process 0 (agents 0, 1) died (its connection closed)", "")
    text = str(failure(3, [hung, caused_2], [1, -9, 1], [1]))
    assert text.startswith("process 0 of 3 failed: TransportError") and "did not answer" in text
    assert "the launcher stopped process 1" in text
    gloo = (2, "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:1458: Connection reset by peer", "")
    assert str(failure(3, [gloo, own], [1, 1, 1], [])).startswith("process 1 of 3 failed: ValueError")


# ---- finding 8: run locks and the summary line ----------------------------------------------------------------------
def test_two_launches_on_one_folder_never_run_a_run_twice(tmp_path):
    """Two `privdl run --procs 2` started together on one --out with two runs: process 0 of each takes a run's lock
    before running it, so each run is executed by one launch only (the executed counts sum to 2, whatever the
    interleaving), a launch waits for the run the other holds, and both end with the runner's summary line
    (`2 runs (X executed, Y already done[, Z by another process sharing the folder]) in S s → …/results.csv`)."""
    cfg = _config(tmp_path, T=600)
    cfg.write_text(cfg.read_text().replace("seeds = [0]", "seeds = [0, 1]"))
    out = tmp_path / "shared"
    first, second = _start(cfg, out, 2, "--quiet"), _start(cfg, out, 2, "--quiet")
    texts = [" ".join(p.communicate(timeout=240)[0].split()) for p in (first, second)]  # lines the console wrapped
    assert [p.returncode for p in (first, second)] == [0, 0], texts
    executed = []
    for text in texts:
        m = re.search(r"(?:^| )2 runs \((\d) executed, (\d) already done(?:, (\d) by another process sharing the "
                      r"folder)?\) in [\d.]+ s → .*?results\.csv", text)
        assert m, text
        x, y, z = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        assert x + y + z == 2, text
        executed.append(x)
    print("executed by each launch:", executed)
    assert sum(executed) == 2, texts
    rows = _rows(out)
    assert len(rows) == len({r[:-1] for r in rows}) and {r[0] for r in rows} == {"0", "1"}  # both seeds, once


def test_process_0_waits_for_a_run_another_process_holds(tmp_path):
    """Process 0's orders (no processes needed): a run another live process holds is not run; the others are; the
    held one is waited for (WAIT orders, well within the timeout) and, once finished there, not run here."""
    import threading

    from privdl.experiment import load_config
    from privdl.experiment.config import expand
    from privdl.experiment.store import ResultStore
    from privdl.runtime.worker import END, RUN, WAIT, _orders

    cfg = load_config(_config(tmp_path), ["seeds=[0, 1, 2]"])
    unique = expand(cfg)[0]
    store = ResultStore(tmp_path / "o")
    store.claim(cfg)
    other = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(60)"])
    try:
        held = store.run_dir(unique[1].run_id)
        held.mkdir(parents=True)
        (held / ".lock").write_text(f"{__import__('socket').gethostname()} {other.pid}\n")
        notes = []
        orders = _orders(cfg, store, unique, [0, 1, 2], timeout=0.4, say=notes.append)
        got = [next(orders)[:2], next(orders)[:2]]
        assert got == [(RUN, 0), (RUN, 2)]
        store.unlock(unique[0].run_id)
        store.unlock(unique[2].run_id)
        began = time.perf_counter()
        assert next(orders)[:2] == (WAIT, -1) and time.perf_counter() - began < 0.4  # a quarter of the timeout
        assert notes and "waiting for 1 run(s) held by other processes" in notes[0]

        def finish():  # the other process finishes its run
            time.sleep(0.5)
            store.save_run(unique[1].run_id, [(0, "test_loss", 1.0)], {"status": "complete",
                                                                      "run_id": unique[1].run_id})
            (held / ".lock").unlink()

        t = threading.Thread(target=finish)
        t.start()
        rest = []
        while not rest or rest[-1][0] != END:
            rest.append(next(orders)[:2])
        t.join()
        assert set(rest[:-1]) == {(WAIT, -1)}, rest
    finally:
        other.kill()
        other.wait()


# ---- finding 8: the torchrun entry point ----------------------------------------------------------------------------
@pytest.mark.parametrize("env,match", [
    ({"RANK": "a", "WORLD_SIZE": "2"}, r"RANK = 'a' is not an integer"),
    ({"RANK": "3", "WORLD_SIZE": "2"}, r"RANK = 3 is not below WORLD_SIZE = 2: the ranks of 2 processes are 0 … 1"),
    ({"WORLD_SIZE": "2"}, r"RANK is not set: start this module with torchrun"),
    ({"RANK": "0"}, r"WORLD_SIZE is not set"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, r"WORLD_SIZE = 0 must be >= 1"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, r"RANK = -1 must be >= 0"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "x"}, r"LOCAL_RANK = 'x' is not an integer"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, r"LOCAL_RANK = 1 is larger than RANK = 0"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "1"},
     r"LOCAL_RANK = 1 is not below LOCAL_WORLD_SIZE = 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}, r"LOCAL_WORLD_SIZE = 3 is larger than WORLD_SIZE"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, r"MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
     r"MASTER_PORT = 70000 is not a port"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "p"}, r"MASTER_PORT = 'p' is not an integer"),
])
def test_the_process_environment_is_checked_up_front(env, match):
    from privdl.errors import PrivdlError
    from privdl.runtime.__main__ import process_environment

    with pytest.raises(PrivdlError, match=match):
        process_environment(env)
    assert process_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}) == (1, 2)


def test_a_bad_rank_stops_at_once_with_one_line(tmp_path):
    """`RANK=3 WORLD_SIZE=2 python -m privdl.runtime CONFIG`: one line naming RANK and WORLD_SIZE, at once (not
    after the rendezvous timeout), no traceback."""
    cfg = _config(tmp_path, timeout=60)
    env = {**os.environ, "RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    began = time.perf_counter()
    got = subprocess.run([PYTHON, "-m", "privdl.runtime", str(cfg)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert got.returncode == 1 and time.perf_counter() - began < 30
    assert got.stderr.strip().splitlines() == ["error: RANK = 3 is not below WORLD_SIZE = 2: the ranks of 2 processes "
                                               "are 0 … 1"], got.stderr


DYING = '''import os, sys
from privdl.runtime import __main__ as entry
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
    import privdl.runtime.transport as transport
    exchange, calls = transport.DistTransport.exchange, [0]
    def dying(self, *args, **kwargs):  # dies in round 21 of the first attempt
        calls[0] += 1
        if calls[0] > 20:
            os._exit(3)
        return exchange(self, *args, **kwargs)
    transport.DistTransport.exchange = dying
entry.main(sys.argv[1:])
'''


def test_a_torchrun_restart_works_with_the_documented_command(tmp_path):
    """`torchrun --standalone --nproc-per-node 2 --max-restarts 1` (torchrun's default shared store: no
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE) where worker 1 dies in round 21 of the first attempt: the second attempt
    rendezvouses under its own prefix and writes the simulator's results (with torch's plain ``env://`` it read the
    first attempt's keys from the store the agent keeps and failed: "connectFullMesh failed … Connection refused",
    pytorch/pytorch#135712)."""
    from typer.testing import CliRunner

    from privdl.cli import app

    cfg = _config(tmp_path, T=40)
    script = tmp_path / "dying.py"
    script.write_text(DYING)
    env = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
    torchrun = Path(PYTHON).with_name("torchrun")
    out = tmp_path / "dist"
    got = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                          str(script), str(cfg), "--out", str(out)], env=env, capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-4000:]
    assert "process 1 (agents 2, 3) died" in got.stderr, got.stderr[-3000:]  # the first attempt did fail
    assert re.search(r"^1 runs \(1 executed, 0 already done\) in", got.stdout, re.M), got.stdout
    want = CliRunner().invoke(app, ["run", str(cfg), "--out", str(tmp_path / "sim"), "--no-plot", "--quiet"])
    assert want.exit_code == 0, want.output
    # (to rounding: each process evaluates its own agents' metrics and the sums meet in another order — the bound
    # and its derivation are tests/test_runtime.py's)
    _same_within_rounding(_rows(out), _rows(tmp_path / "sim"))


def test_torchrun_shows_the_error_in_its_summary(tmp_path):
    """A worker's error under torchrun is written to torchrun's error file: the summary it prints last shows the
    message (not "error_file: <N/A>"), and the worker's own stderr has it in one line, without a traceback."""
    torchrun = Path(PYTHON).with_name("torchrun")
    missing = tmp_path / "missing.toml"
    got = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "1", "-m", "privdl.runtime",
                          str(missing)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert got.returncode != 0
    summary = got.stderr[got.stderr.index("Root Cause"):]
    assert "error_file: <N/A>" not in summary and str(missing) in summary, summary
    assert re.search(rf"^error \(process 0 of 1\): .*{re.escape(str(missing))}", got.stderr, re.M), got.stderr
