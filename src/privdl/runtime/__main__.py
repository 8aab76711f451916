"""``torchrun ... -m privdl.runtime CONFIG [--out DIR] [--set key=value]... [--resume]``: one worker process of the
distributed runtime; torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main(argv: list[str] | None = None) -> None:
    import torch.distributed as dist

    from privdl.errors import PrivdlError
    from privdl.experiment import load_config
    from privdl.runtime.launch import DEFAULT_TIMEOUT
    from privdl.runtime.worker import init_process_group, run_experiment_distributed

    ap = argparse.ArgumentParser(prog="python -m privdl.runtime")
    ap.add_argument("config")
    ap.add_argument("--out", default=None, help="results folder (default: results/<config name>, as privdl run)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except KeyError as exc:
        sys.exit(f"error: {exc.args[0]} is not set: start this module with torchrun (or use privdl run --procs K)")
    try:
        cfg = load_config(args.config, [*args.overrides, 'runtime.backend="dist"'])  # what torchrun starts
        timeout = float(cfg.get("runtime", {}).get("timeout", DEFAULT_TIMEOUT))
        init_process_group(rank=rank, world=world, init_method="env://", timeout=timeout)
        try:
            # torchrun's --max-restarts starts every worker again after a failure: continue from the checkpoints
            restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
            out = args.out or str(Path("results") / Path(args.config).stem)
            run_experiment_distributed(cfg, out, rank=rank, world=world, timeout=timeout,
                                       resume=args.resume or restarted, progress=True)
        finally:
            dist.destroy_process_group()
    except PrivdlError as exc:
        sys.exit(f"error (process {rank} of {world}): {exc}")


if __name__ == "__main__":
    main()
