"""Launching the distributed runtime: ``privdl run CONFIG --procs K`` on one machine, ``torchrun ... -m
privdl.runtime CONFIG`` on several.

On one machine the K worker processes are spawned with ``multiprocessing`` and meet through a TCP store on a
loopback port the launcher holds until process 0 serves the store on it (:func:`reserve_port`); each joins the
gloo process group with the run's timeout and runs
:func:`privdl.runtime.worker.run_experiment_distributed`. The workers die with the launcher (:func:`die_with`: a
parent-death signal on Linux, a watch of the parent elsewhere). The launcher polls its workers (never a ``join`` in
order): at the first failure — an error a worker reports, or a worker that ends without one (killed) — it gives the
others :data:`GRACE` seconds to stop on their own (a dead peer's connection closes at once; a hung peer's receive
fails at ``runtime.timeout``), then stops the rest (SIGKILL, which also ends a stopped process) and
raises the first real error — not the transport errors it caused in the others, unless they are all there is (a
killed or hung process: its peers name it).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

from privdl.errors import PrivdlError
from privdl.process_defaults import before_exit, for_children
from privdl.runtime_spec import RuntimeSpec

#: seconds the other workers get, after the first failure, to stop on their own and say why before they are stopped
GRACE = 3.0
#: Linux's prctl option that sends a signal to this process when its parent (the thread that started it) ends
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A loopback port free now (the socket that found it is closed: another program may take it before it is used;
    a launch holds its rendezvous port instead, :func:`reserve_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reserve_port() -> socket.socket:
    """A socket bound to a free loopback port, for a launch's rendezvous: the launcher holds it from the choice of
    the port until its workers start, and process 0's TCP store serves on it (``master_listen_fd``), so no other
    program can take the port in between — with :func:`free_port` the port was free when chosen and bound seconds
    later, when process 0 had imported torch, and a concurrent launch or any program binding an ephemeral port
    could take it first (process 0 then fails to serve the store). Bound, not listening: until process 0 serves,
    the other workers' connections are refused and they retry until ``runtime.timeout`` — a listening socket would
    queue them, and torch's store client waits for the handshake's answer without a deadline, so a process 0 that
    hangs before serving would hang the whole launch."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
    except BaseException:
        s.close()
        raise
    return s


def die_with(parent: int | None) -> str:
    """Make this process end when its parent ends (killed, crashed): on Linux the kernel sends it SIGKILL
    (``prctl(PR_SET_PDEATHSIG)``; SIGKILL also ends a stopped process), and a parent that ended before that call —
    ``os.getppid()`` is no longer ``parent`` — ends it at once; elsewhere a thread checks every second that
    ``parent`` is still its parent (:func:`privdl.experiment.runner._exit_with`). ``parent`` None: the process's
    parent now (torchrun's agent). Returns how ("prctl" or "watch")."""
    parent = os.getppid() if parent is None else parent
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent ended before the signal was asked for
                    os._exit(1)
                return "prctl"
        except (OSError, AttributeError):
            pass
    from privdl.experiment.runner import _exit_with

    if os.getppid() != parent:
        os._exit(1)
    _exit_with(parent)
    return "watch"


#: process 0's summary fields, sent to the launcher. The workers' messages to the launcher — ("error", rank,
#: message, traceback) or ("summary", rank, fields) — go through a multiprocessing pipe between the launcher and its
#: own children on this machine; the network carries none of them
SUMMARY_FIELDS = ("runs", "executed", "skipped", "results", "seconds", "busy", "nonfinite", "others")


def _worker(rank: int, world: int, port: int, config: str, overrides: list[str], out: str, resume: bool,
            threads: int | None, messages, progress: bool = False, parent: int | None = None,
            check: bool = False, listener: socket.socket | None = None) -> None:
    """One worker of :func:`launch`. ``check``: it first checks the launch (:func:`_check`; the launcher did not,
    so as not to load torch and the config's registries before the first worker starts); a refusal — alike in
    every worker, before any file is touched — goes to the launcher as ("refused", rank, error class, message),
    which raises it. ``threads``: its intra-op threads (None: torch's default here, shared by the ``world``
    processes — what a launcher that has not loaded torch would have computed). ``listener``: process 0's, the
    launcher's socket on ``port`` (:func:`reserve_port`), on which it serves the rendezvous store."""
    die_with(parent)
    import torch
    import torch.distributed as dist

    from privdl.experiment import load_config
    from privdl.runtime.worker import init_process_group, run_experiment_distributed

    torch.set_num_threads(threads if threads is not None else max(1, torch.get_num_threads() // world))
    # this process's place on the host, as torchrun gives it: its device follows from it (privdl.device)
    os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"] = str(rank), str(world)
    try:
        try:
            if check:
                _check(config, overrides, world)
        except PrivdlError as exc:
            messages.put(("refused", rank, f"{type(exc).__module__}:{type(exc).__qualname__}", str(exc)))
            leave(1)
        cfg = load_config(config, overrides)
        timeout = RuntimeSpec.of(cfg).timeout
        listen_fd = None if listener is None else listener.detach()
        if listen_fd is not None:  # the store's alone: no program this process starts keeps the port
            os.set_inheritable(listen_fd, False)
        init_process_group(rank=rank, world=world, init_method=None, timeout=timeout, port=port, listen_fd=listen_fd)
        summary = run_experiment_distributed(cfg, out, rank=rank, world=world, timeout=timeout, resume=resume,
                                             progress=progress)
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which names it
        messages.put(("error", rank, f"{type(exc).__name__}: {exc}",
                      "" if isinstance(exc, PrivdlError) else traceback.format_exc()))
        leave(1)
    dist.destroy_process_group()
    if summary is not None:
        messages.put(("summary", rank, {k: (str(v) if k == "results" else v)
                                        for k, v in vars(summary).items() if k in SUMMARY_FIELDS}))
    before_exit()  # the launcher waits for this process's exit: no collections over torch's objects first


def leave(code: int) -> None:
    """End a failed worker now: its run's lock is released and its files are whole (both happen as the error
    propagates), while tearing down a process group with a peer gone or hung can block for the whole timeout (and
    torchrun acts on a worker's exit, not on its error)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


#: what a worker says when a peer's failure stopped it (not a failure of its own)
_CAUSED = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out waiting")


def _caused(message: str) -> bool:
    """An error that another process's failure caused in this one: the transport's (naming the peer) or gloo's own
    (an operation outside the transport found a peer gone: RuntimeError, DistBackendError …)."""
    return message.startswith("TransportError") or any(c in message for c in _CAUSED)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _stop(workers: list) -> list[int]:
    """Stop the workers still running with SIGKILL (which also ends a stopped process; a worker keeps nothing that
    a kill loses: its run's files are written whole, and a lock of a process that ended is taken over). Returns
    their ranks."""
    alive = [r for r, w in enumerate(workers) if w.exitcode is None]
    for r in alive:
        workers[r].kill()
    for r in alive:
        workers[r].join()
    return alive


def supervise(workers: list, messages, *, grace: float = GRACE,
              refused: list | None = None) -> tuple[dict | None, list, list[int], float | None]:
    """Wait for the started ``workers`` without joining them in order: poll their exits and ``messages``; at the
    first failure give the others ``grace`` seconds, then stop those still running. Returns (process 0's summary
    fields or None, the errors reported (rank, message, traceback) in arrival order, the ranks stopped, seconds
    from the first failure to the end or None). A refusal of the launch (a worker's ("refused", rank, error class,
    message): its config, every worker's alike) is appended to ``refused`` and stops the others at once."""
    from multiprocessing.connection import wait

    summary, errors, first = None, [], None
    refused = [] if refused is None else refused

    def drain() -> None:
        nonlocal summary
        while not messages.empty():
            m = messages.get()
            if m[0] == "summary":
                summary = m[2]
            elif m[0] == "refused":
                refused.append(tuple(m[1:]))
            else:
                errors.append(tuple(m[1:]))

    while True:
        drain()
        alive = [w for w in workers if w.exitcode is None]
        if first is None and (errors or refused or any(w.exitcode for w in workers)):
            first = time.monotonic()
        if not alive or refused or (first is not None and time.monotonic() - first > grace):
            break
        wait([w.sentinel for w in alive], timeout=0.2)
    stopped = _stop(workers)
    drain()
    return summary, errors, stopped, None if first is None else time.monotonic() - first


def failure(procs: int, errors: list, codes: list[int | None], stopped: list[int]) -> PrivdlError:
    """The error a failed launch raises: the first error of a process's own (not one its stopping caused in the
    others); else a process that ended without a word (killed) and what its peers said; else the peers' first
    message (a hung process: they name it); the processes the launcher had to stop are named."""
    own = [e for e in errors if not _caused(e[1])]
    caused = [e for e in errors if _caused(e[1])]
    told = {e[0] for e in errors}
    silent = [r for r, c in enumerate(codes) if c and r not in told and r not in stopped]
    killed = [r for r in silent if codes[r] < 0]
    if own:
        rank, message, trace = own[0]
        text = f"process {rank} of {procs} failed: {message}" + (f"\n{trace}" if trace else "")
    elif killed:
        r = killed[0]
        text = (f"process {r} of {procs} was killed ({_signal_name(codes[r])}: from outside, or out of memory)"
                + (f"; process {caused[0][0]} said: {caused[0][1]}" if caused else ""))
    elif caused:
        rank, message, _ = caused[0]
        text = f"process {rank} of {procs} failed: {message}"
    elif silent:
        text = f"process {silent[0]} of {procs} ended with exit code {codes[silent[0]]} without an error"
    else:
        text = f"worker processes ended with exit codes {codes}"
    if stopped:
        text += (f" (the launcher stopped process{'es' if len(stopped) > 1 else ''} "
                 f"{', '.join(map(str, stopped))}, still running {GRACE:g} s after the first failure)")
    return PrivdlError(text)


def processes_for(cfg: dict) -> int | None:
    """The processes ``runtime.agents_per_process`` asks for (its first run's network), or None."""
    per = RuntimeSpec.of(cfg).agents_per_process
    if not per:
        return None
    from privdl.experiment.build import build_network
    from privdl.experiment.config import expand

    c = expand(cfg)[0][0].config
    n = build_network(c["network"], c["seed"], c.get("base_dir")).n
    return -(-n // per)


def check_devices(cfg: dict, procs: int, gpus: int | None = None) -> None:
    """Refuse, before any process starts, a ``device`` this machine cannot give every one of its ``procs``
    processes (:func:`privdl.device.process_device`: a GPU asked for where torch sees none, a ``cuda:N`` it does
    not show, NCCL on a shared GPU or on the CPU) — the error names the run and why."""
    from privdl.device import check_transport, process_device, visible_gpus
    from privdl.experiment.config import expand
    from privdl.experiment.loop_steps import run_label

    gpus = visible_gpus() if gpus is None else gpus
    seen = set()
    for spec in expand(cfg)[0]:
        device, transport = spec.config.get("device", "cpu"), RuntimeSpec.of(spec.config).transport
        if (device, transport) in seen:
            continue
        seen.add((device, transport))
        try:
            kinds = {process_device(device, local_rank=r, local_world=procs, gpus=gpus, transport=transport,
                                    who=f"process {r} of {procs}").type for r in range(procs)}
            if kinds != {"cpu"}:
                _check_task_moves(spec.config, device)
        except PrivdlError as exc:
            raise type(exc)(f"run {run_label(spec)}: {exc}") from None
        check_transport(RuntimeSpec.of(spec.config), procs, gpus, device)


def _check_task_moves(cfg: dict, device: str) -> None:
    """Refuse a run on a GPU whose task cannot move there (a task that keeps :meth:`privdl.tasks.base.Task.to`,
    which runs on the CPU only) — before any process claims a file, not at its first move. Builds the task (a GPU
    run only)."""
    from privdl.errors import ValidationError
    from privdl.experiment.build import build_network, build_task
    from privdl.tasks.base import Task

    task = build_task(cfg, build_network(cfg["network"], cfg.get("seed", 0), cfg.get("base_dir")).n)
    if type(task).to is Task.to:
        raise ValidationError(f"task {task.name!r} runs on the CPU only (asked for device {device!r}); use "
                              "device = \"cpu\"")


def _check(config: str | Path, overrides: list[str], procs: int) -> None:
    """Refuse what every process would refuse, before any process touches a file: a bad config, a device or
    transport this machine cannot give the processes, more processes than a run has agents, an assignment of
    another number of parts. The launcher runs it, or each worker first (:func:`launch`)."""
    from privdl.experiment import load_config
    from privdl.runtime.worker import check_placements

    cfg = load_config(config, overrides)
    check_devices(cfg, procs)
    check_placements(cfg, procs)


def _refusal(refused: list) -> PrivdlError:
    """The error a worker refused the launch with (:func:`_check`'s), as the launcher raises it: its class — a
    :class:`PrivdlError` subclass of a privdl module, named ``module:qualname`` (a name only, resolved by import:
    nothing unpickled), else :class:`PrivdlError` — and its message, unchanged."""
    import importlib

    _, name, message = refused[0]
    module, _, qualname = str(name).partition(":")
    cls = None
    if module == "privdl" or module.startswith("privdl."):
        try:
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
        except (ImportError, AttributeError):
            cls = None
    return (cls if isinstance(cls, type) and issubclass(cls, PrivdlError) else PrivdlError)(message)


def _privdl_command(main) -> bool:
    """Whether the main module is privdl's own command: the ``privdl`` console script (its ``main`` is the CLI's) or
    a module of privdl run with ``python -m``."""
    entry = main.__dict__.get("main")
    spec = main.__dict__.get("__spec__")
    return (str(getattr(entry, "__module__", "")).startswith("privdl.cli")
            or str(getattr(spec, "name", "") or "").startswith("privdl."))


@contextmanager
def main_not_rerun():
    """Within the block, processes spawned do not run the ``privdl`` command's main module again. ``spawn`` runs the
    starting program's main module in every child (as ``__mp_main__``, by its path or its module name) so that what
    it defines can be unpickled there; the workers' target and arguments live in privdl's modules, so the
    ``privdl`` command's script is not needed there — and it would import the CLI (typer, rich) into every worker.
    Its ``__file__`` and ``__spec__`` are hidden from multiprocessing while the processes start, and restored. A
    program of a user's is run again as before (what it registers at its top level — an algorithm, a dataset —
    is then known to the workers too)."""
    main = sys.modules.get("__main__")
    if main is not None and not _privdl_command(main):
        main = None
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__} if main else {}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def launch(config: str | Path, *, procs: int, out: str | Path, overrides: list[str] | None = None,
           resume: bool = False, progress: bool = False):
    """Run the experiment of ``config`` with its agents split over ``procs`` processes on this machine. Returns the
    :class:`~privdl.experiment.outcome.ExperimentSummary` (the runner's: runs, executed, already done, by another
    process sharing ``out``); a failure raises :class:`PrivdlError` once every worker has stopped.

    The launch is checked (:func:`_check`) before anything is touched: here, before any process starts, when this
    process has torch loaded already (a program of the user's, a test); else — the ``privdl`` command — by each
    worker, first, so that the launcher does not load torch and the config's registries (1.5–3 s of CPU, the
    largest serial part of the start: BENCHMARKS.md, "Start-up (issue 44)") before its first worker starts; a
    refusal is raised here as the workers raised it (its class and message), the other workers stopped."""
    import multiprocessing as mp  # the standard library's: the messages carry no tensors (torch's adds their pickling)

    if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
        raise PrivdlError(f"--procs must be an integer >= 1, got {procs!r}")
    started = time.perf_counter()
    checked = "torch" in sys.modules  # the check's largest import is here already: refuse before any process starts
    if checked:
        _check(config, overrides or [], procs)
    ctx = mp.get_context("spawn")
    messages = ctx.SimpleQueue()
    # a launcher with torch loaded shares its own thread count (perhaps set by its program); one without it has
    # torch's default, which each worker reads for itself
    threads = max(1, sys.modules["torch"].get_num_threads() // procs) if checked else None
    listener = reserve_port()  # held until the workers start: process 0 serves the rendezvous on it
    port = int(listener.getsockname()[1])
    workers = [ctx.Process(target=_worker, args=(r, procs, port, str(config), list(overrides or []), str(out),
                                                 resume, threads, messages, progress, os.getpid(), not checked,
                                                 listener if r == 0 else None),
                           daemon=False)
               for r in range(procs)]
    refused: list = []
    try:
        try:
            with for_children(), main_not_rerun():  # privdl's process defaults for the workers (not for this, perhaps
                # a user's, process); the workers import what they run, not the program that launched them
                for w in workers:
                    w.start()
        finally:  # process 0 has its own copy of the socket (passed at its start): the launcher's is closed
            listener.close()
        summary, errors, stopped, _ = supervise(workers, messages, refused=refused)
    finally:  # an interrupted launcher (Ctrl-C, an error here) leaves no worker behind
        _stop([w for w in workers if w.pid is not None])
    if refused:
        raise _refusal(refused)
    from privdl.experiment.outcome import ExperimentSummary  # (no torch: privdl.experiment.outcome)

    codes = [w.exitcode for w in workers]
    if errors or any(codes) or summary is None:
        raise failure(procs, errors, codes, stopped)
    fields = dict(summary, results=Path(summary["results"]), seconds=time.perf_counter() - started)
    return ExperimentSummary(out=Path(out), **fields)


__all__ = ["GRACE", "check_devices", "die_with", "free_port", "launch", "reserve_port", "supervise"]
