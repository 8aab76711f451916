"""A finished run's manifest: its config, code and package versions, seeds and key mode, its components' facts, its
privacy ledger, the process and device it ran on, and its final metrics (plus seed 002's error bounds for DSG-RMS
runs).

Separate from running (:mod:`privdl.experiment.run_pipeline`): the manifest is the record a results folder keeps
and readers check (ledgers, devices, input files), and the distributed runtime's process 0 writes the same record
for the runs it gathers.
"""

from __future__ import annotations

import functools
import os
import platform
import time

import torch

import privdl
from privdl.experiment.build import Components, input_files
from privdl.experiment.config import RunSpec
from privdl.privacy.ledger import Ledger, statement
from privdl.runtime_spec import RuntimeSpec

def _utc(stamp: float) -> str:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(stamp, tz=timezone.utc).isoformat(timespec="seconds")


@functools.cache  # reading the packages' metadata costs ≈ 8 ms; a sweep writes one manifest per run
def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("numpy", "scipy", "dp-accounting", "torch", "networkx"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:  # pragma: no cover - all are dependencies
            out[pkg] = "absent"
    return out


#: the manifest's statement of agreed keys (runtime.keys = "agreed"); the threat model is in its ``keys`` section
KEYS_AGREED = ("agreed: X25519 between the agents that share a draw (bound to both public keys and the run), "
               "256-bit HKDF-SHA256 keys per (purpose, holders), requester and counter folded one way (BLAKE2b-256), "
               "ChaCha20 keystreams; group secrets wrapped with ChaCha20-Poly1305; own draws from a per-agent 256-bit "
               "secret; the initial model from the root seed (public). Threat model: see keys.threat_model")


def run_ledger(spec: RunSpec, c: Components, accesses: torch.Tensor | None) -> Ledger:
    """A run's privacy statement (:func:`privdl.privacy.ledger.statement`) over the noisy accesses it made
    (``accesses``: per owner; None: the ones its mechanism covers) — the ledger its manifest holds."""
    return statement(c.mechanism, c.algorithm, iterations=spec.config["iterations"], edges=c.network.edges,
                     accesses=accesses)


def manifest(spec: RunSpec, c: Components, *, seconds: float, rows: list[tuple[int, str, float]],
             accesses: torch.Tensor | None, batch: dict | None = None, keys: dict | None = None,
             ledger: Ledger | None = None) -> dict:
    """A finished run's manifest: its config, code, seeds, components' facts, privacy ledger (``ledger``, else
    :func:`run_ledger`), process and final metrics."""
    cfg = spec.config
    last = max((r[0] for r in rows), default=0)
    final = {m: v for t, m, v in rows if t == last}
    ledger = ledger if ledger is not None else run_ledger(spec, c, accesses)
    agreed = RuntimeSpec.of(cfg).agreed
    return {
        "run_id": spec.run_id,
        "status": "complete",
        "config": cfg,
        "sweep": spec.sweep,
        "privdl_version": privdl.__version__,
        "privdl_source_sha256": privdl.source_hash(),
        "torch_version": torch.__version__,
        "versions": dict(_versions()),
        "python": platform.python_version(),
        "seeds": {"run": cfg["seed"], "network": cfg["network"].get("seed", 0), "data": cfg["task"].get("seed", 0),
                  "keys": (KEYS_AGREED if agreed else
                           "root seed → (purpose, access, agent[, neighbour]) and shared keys per holder set")},
        "network": c.network.facts(),
        "W_fingerprint": c.network.fingerprint,
        **({"dynamics": c.network.dynamics.law()} if c.network.dynamics is not None else {}),
        "input_files": input_files(cfg),
        "task": c.task.describe(),
        "mechanism": c.mechanism.describe(),
        **({"algorithm": {"name": c.algorithm.name, **c.algorithm.facts}} if c.algorithm.facts else {}),
        "privacy_ledger": [{**ledger.to_dict(), "keys": "agreed" if agreed else "root"}],
        **({"keys": keys} if keys is not None else {}),
        "trained": cfg.get("train", True),
        "batch": batch or {"replicas": 1},
        "seconds": seconds,
        "finished_at": _utc(time.time()),
        "started_at": _utc(time.time() - seconds),
        # which process of a sharded / --jobs run, and what decides its last bits besides the code and the seed: the
        # kernels ATen picked for this CPU and the intra-op threads (docs/ARCHITECTURE.md, "What is bit-exact")
        "process": {"host": platform.node(), "pid": os.getpid(), "threads": torch.get_num_threads(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability(), "machine": platform.machine()},
        "device_info": device_info(c.task.device),
        "iterations_per_second": cfg["iterations"] / seconds if seconds > 0 and cfg.get("train", True) else None,
        "final_metrics": final,
    }


def device_info(device: torch.device) -> dict:
    """Where a run computed: the device, and for a GPU its name and CUDA version (for merged grids: the device is
    where a run ran, not what it is)."""
    dev = torch.device(device)
    out: dict = {"type": dev.type, "device": str(dev)}
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        out.update(name=torch.cuda.get_device_name(index), cuda=torch.version.cuda)
    else:
        out["name"] = platform.processor() or platform.machine()
    return out


def finished_run(spec: RunSpec, c: Components, rows: list[tuple[int, str, float]], **facts
                 ) -> tuple[list[tuple[int, str, float]], dict]:
    """A finished run's rows and manifest (:func:`manifest` with ``facts``): a DSG-RMS / EDSG-RMS run's rows gain
    seed 002's error bounds and its manifest their account (:func:`privdl.algorithms.rms_bounds.with_error_bounds`)."""
    from privdl.algorithms.rms_bounds import with_error_bounds

    rows, theory = with_error_bounds(spec.config, c, rows)
    out = manifest(spec, c, rows=rows, **facts)
    if theory is not None:
        out["error_bounds"] = theory
    return rows, out
