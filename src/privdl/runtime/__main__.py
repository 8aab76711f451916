"""``torchrun ... -m privdl.runtime CONFIG [--out DIR] [--set key=value]... [--plugin MODULE]... [--resume]``: one
worker process of the distributed runtime; torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (checked before
anything starts: a bad value is one clear error, not a traceback or a wait for the timeout).

An error is written to torchrun's error file (``TORCHELASTIC_ERROR_FILE``, what ``@record`` writes), so the summary
torchrun prints last shows its message, and the process exits with a one-line ``error (process r of w): ...``. The
worker dies with its torchrun agent (:func:`privdl.runtime.launch.die_with`). Process 0 ends with the runner's
summary line (``N runs (X executed, Y already done) in S s → results.csv``). Started as a program, it sets privdl's
process defaults first (:mod:`privdl.process_defaults`), as the ``privdl`` command does; imported, it sets nothing."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # a worker process (torchrun, python -m): privdl's process defaults before torch loads
    from privdl.process_defaults import apply

    apply()

from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402


def process_environment(env: dict | None = None) -> tuple[int, int]:
    """RANK and WORLD_SIZE (and LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT where set), checked: integers,
    0 <= RANK < WORLD_SIZE, 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE, a port in 1..65535. Raises
    :class:`PrivdlError` naming the variable and what it must be."""
    from privdl.errors import PrivdlError

    env = os.environ if env is None else env
    how = "start this module with torchrun (or use privdl run CONFIG --procs K on one machine)"

    def integer(name: str, low: int, required: bool = True) -> int | None:
        text = env.get(name)
        if text is None:
            if required:
                raise PrivdlError(f"{name} is not set: {how}")
            return None
        try:
            value = int(text.strip())
        except ValueError:
            raise PrivdlError(f"{name} = {text!r} is not an integer: {how}") from None
        if value < low:
            raise PrivdlError(f"{name} = {value} must be >= {low}")
        return value

    world = integer("WORLD_SIZE", 1)
    rank = integer("RANK", 0)
    if rank >= world:
        raise PrivdlError(f"RANK = {rank} is not below WORLD_SIZE = {world}: the ranks of {world} processes are "
                          f"0 … {world - 1}")
    local_world = integer("LOCAL_WORLD_SIZE", 1, required=False)
    if local_world is not None and local_world > world:
        raise PrivdlError(f"LOCAL_WORLD_SIZE = {local_world} is larger than WORLD_SIZE = {world}")
    local = integer("LOCAL_RANK", 0, required=False)
    if local is not None and local > rank:
        raise PrivdlError(f"LOCAL_RANK = {local} is larger than RANK = {rank}: a host's processes are numbered "
                          "0 … k-1 on the host and RANK counts them over all hosts")
    if local is not None and local_world is not None and local >= local_world:
        raise PrivdlError(f"LOCAL_RANK = {local} is not below LOCAL_WORLD_SIZE = {local_world}")
    if not env.get("MASTER_ADDR"):
        raise PrivdlError(f"MASTER_ADDR is not set: {how}")
    port = integer("MASTER_PORT", 1)
    if port > 65535:
        raise PrivdlError(f"MASTER_PORT = {port} is not a port (1 … 65535)")
    return rank, world


def _report(exc: BaseException, where: str) -> None:
    """Write ``exc`` to torchrun's error file (its summary shows the message) and leave at once with one line
    (:func:`privdl.runtime.launch.leave`: no teardown of a process group whose peers are gone)."""
    from privdl.runtime.launch import leave

    if os.environ.get("TORCHELASTIC_ERROR_FILE"):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        try:
            ErrorHandler().record_exception(exc)
        except OSError:
            pass
    print(f"error{where}: {exc}", file=sys.stderr)
    leave(1)


@record
def main(argv: list[str] | None = None) -> None:
    from privdl.errors import PrivdlError
    from privdl.runtime.launch import die_with

    die_with(None)  # killed with torchrun's agent: never an orphan holding memory and cores
    ap = argparse.ArgumentParser(prog="python -m privdl.runtime")
    ap.add_argument("config")
    ap.add_argument("--out", default=None, help="results folder (default: results/<config name>, as privdl run)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--plugin", dest="plugins", action="append", default=[],
                    help="import this module before the config is checked (privdl.plugins; repeatable)")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    try:
        rank, world = process_environment()
    except PrivdlError as exc:
        _report(exc, "")
    try:
        import torch.distributed as dist

        from privdl.experiment import load_config
        from privdl.runtime.worker import init_process_group, run_experiment_distributed
        from privdl.runtime_spec import RuntimeSpec

        cfg = load_config(args.config, [*args.overrides, 'runtime.backend="dist"'],  # what torchrun starts
                          plugins=args.plugins)
        timeout = RuntimeSpec.of(cfg).timeout
        init_process_group(rank=rank, world=world, init_method="env://", timeout=timeout)
        # torchrun's --max-restarts starts every worker again after a failure: continue from the checkpoints
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
        out = args.out or str(Path("results") / Path(args.config).stem)
        summary = run_experiment_distributed(cfg, out, rank=rank, world=world, timeout=timeout,
                                             resume=args.resume or restarted, progress=True)
    except PrivdlError as exc:
        _report(exc, f" (process {rank} of {world})")
    except Exception as exc:  # noqa: BLE001 - a bug: torchrun's summary shows it, with its traceback
        import traceback

        traceback.print_exc()
        _report(exc, f" (process {rank} of {world})")
    dist.destroy_process_group()
    if summary is not None:
        print(summary.line(), flush=True)
    from privdl.process_defaults import before_exit

    before_exit()  # torchrun waits for this process's exit: no collections over torch's objects first


if __name__ == "__main__":
    main()
