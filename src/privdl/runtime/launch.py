"""Launching the distributed runtime: ``privdl run CONFIG --procs K`` on one machine, ``torchrun ... -m
privdl.runtime CONFIG`` on several.

On one machine the K worker processes are spawned with ``torch.multiprocessing`` and meet through a TCP store on a
free loopback port; each joins the gloo process group with the run's timeout and runs
:func:`privdl.runtime.worker.run_experiment_distributed`. A worker's error stops the launch with that error's
message (the others stop at their next receive: their peer's connection closes).
"""

from __future__ import annotations

import socket
import traceback
from pathlib import Path

from privdl.errors import PrivdlError

#: seconds a receive may wait before the run stops with an error naming the silent peer (runtime.timeout)
DEFAULT_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, config: str, overrides: list[str], out: str, resume: bool,
            threads: int, errors, progress: bool = False) -> None:
    import torch
    import torch.distributed as dist

    from privdl.experiment import load_config
    from privdl.runtime.worker import init_process_group, run_experiment_distributed

    torch.set_num_threads(threads)
    try:
        cfg = load_config(config, overrides)
        timeout = float(cfg.get("runtime", {}).get("timeout", DEFAULT_TIMEOUT))
        init_process_group(rank=rank, world=world, init_method=f"tcp://127.0.0.1:{port}", timeout=timeout)
        try:
            run_experiment_distributed(cfg, out, rank=rank, world=world, timeout=timeout, resume=resume,
                                       progress=progress)
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, which names it
        errors.put((rank, f"{type(exc).__name__}: {exc}",
                    "" if isinstance(exc, PrivdlError) else traceback.format_exc()))
        raise SystemExit(1)


def processes_for(cfg: dict) -> int | None:
    """The processes ``runtime.agents_per_process`` asks for (its first run's network), or None."""
    per = cfg.get("runtime", {}).get("agents_per_process")
    if not per:
        return None
    from privdl.experiment.build import build_network
    from privdl.experiment.config import expand

    c = expand(cfg)[0][0].config
    n = build_network(c["network"], c["seed"], c.get("base_dir")).n
    return -(-n // per)


def check_transport(runtime: dict, procs: int, gpus: int | None = None) -> None:
    """Refuse a transport this machine cannot give the processes: NCCL needs one GPU per process (it refuses two
    ranks on one GPU: "Duplicate GPU detected"), and the runtime moves its messages with gloo (GPU tensors staged
    through the CPU)."""
    if runtime.get("transport", "gloo") != "nccl":
        return
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if procs > gpus:
        raise PrivdlError(f"runtime.transport = \"nccl\" needs one GPU per process: {procs} processes, {gpus} GPU"
                          f"{'s' if gpus != 1 else ''} here (NCCL refuses two processes on one GPU). Use "
                          "transport = \"gloo\" (tensors on a GPU are staged through the CPU)")
    raise PrivdlError("runtime.transport = \"nccl\" is not built yet: the runtime's messages go over gloo, which "
                      "carries tensors of runs on a GPU through the CPU; set transport = \"gloo\"")


def _check(config: str | Path, overrides: list[str], procs: int) -> None:
    """Refuse before starting any process what every process would refuse: a bad config, more processes than a
    run has agents, an assignment of another number of parts."""
    from privdl.experiment import load_config
    from privdl.experiment.build import build_network
    from privdl.experiment.config import expand
    from privdl.runtime.worker import placements_for

    import json

    cfg = load_config(config, overrides)
    check_transport(cfg.get("runtime", {}), procs)
    seen: set[str] = set()
    for spec in expand(cfg)[0]:
        c = spec.config
        if c.get("device", "cpu") not in ("cpu", None):
            raise PrivdlError("the distributed runtime runs its processes on the CPU (gloo); a run on a GPU is not "
                              "built yet: remove device or set it to \"cpu\"")
        key = json.dumps([c["network"], c["seed"] if c["network"].get("seed") == "run" else None,
                          c.get("runtime", {}).get("assignment"),
                          c.get("runtime", {}).get("agents_per_process")], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            placements_for(c, build_network(c["network"], c["seed"], c.get("base_dir")).n, procs)


def launch(config: str | Path, *, procs: int, out: str | Path, overrides: list[str] | None = None,
           resume: bool = False, progress: bool = False) -> None:
    """Run the experiment of ``config`` with its agents split over ``procs`` processes on this machine."""
    import torch
    import torch.multiprocessing as mp

    if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
        raise PrivdlError(f"--procs must be an integer >= 1, got {procs!r}")
    _check(config, overrides or [], procs)
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    threads = max(1, torch.get_num_threads() // procs)
    port = free_port()
    workers = [ctx.Process(target=_worker, args=(r, procs, port, str(config), list(overrides or []), str(out),
                                                 resume, threads, errors, progress), daemon=False)
               for r in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    failed = []
    while not errors.empty():
        failed.append(errors.get())
    if failed or any(w.exitcode for w in workers):
        # a process's own error first: the others' transport errors are what its stopping did to them
        failed.sort(key=lambda e: (e[1].startswith("TransportError"), e[0]))
        if not failed:
            codes = [w.exitcode for w in workers]
            raise PrivdlError(f"worker processes ended with exit codes {codes}")
        rank, message, trace = failed[0]
        raise PrivdlError(f"process {rank} of {procs} failed: {message}" + (f"\n{trace}" if trace else ""))


__all__ = ["DEFAULT_TIMEOUT", "check_transport", "free_port", "launch"]
