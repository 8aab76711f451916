"""Where a run's agents live (``runtime.backend``): the backends, by name, in one registry — the one source of the
valid names (the config's validation asks it) and of what each supports.

* ``simulator``: every agent in one engine of this process (:func:`privdl.simulate`); runs of a sweep may be stacked
  on the replica axis (:func:`privdl.simulator.simulate_replicas`, the runner's batches).
* ``sliced``: one run as K engines in threads of this process, each holding only its agents, joined by an
  in-process transport (:func:`privdl.simulator.simulate_sliced`).
* ``dist``: one run as K processes (:mod:`privdl.runtime`, above this room): ``privdl run CONFIG`` starts them,
  or ``torchrun … -m privdl.runtime``; a process of this room refuses to run it (:meth:`Backend.run`).

Each backend runs one run of a built config (:meth:`Backend.run`) and returns what the runner's manifest needs from
it (:class:`Ran`); what every backend's run shares — the draws counted, the manifest, the checkpoints' facts — is
the runner's (:func:`privdl.experiment.run_pipeline.run_one`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from privdl.agreement import agree_alone, config_options
from privdl.errors import ValidationError
from privdl.keys import Keys, RootKeys
from privdl.placement import partition
from privdl.registry import Registry
from privdl.runtime_spec import RuntimeSpec
from privdl.simulator import SimulationResult, simulate
from privdl.simulator.checkpoint import Checkpoints
from privdl.simulator.sliced import simulate_sliced

#: the eavesdropper's sliding window (rounds) when the config does not say
EAVESDROPPER_WINDOW = 100


def observers(cfg: dict, c: Any, rows: int) -> list:
    """The observers a run carries: seed 002's eavesdropper on tasks with a known target w*(t)
    (``eavesdropper_window`` rounds; 0 turns it off)."""
    window = cfg.get("eavesdropper_window", EAVESDROPPER_WINDOW)
    if not window or not callable(getattr(c.task, "optimum", None)):
        return []
    from privdl.comm.eavesdropper import Eavesdropper

    return [Eavesdropper(rows, window=window, target=c.task.optimum, wire=c.algorithm.wire,
                         transmits=getattr(c.algorithm, "transmits", None))]


@dataclass
class Ran:
    """What a backend's run gives the runner: the simulator's result, the manifest's ``placement`` (None: none),
    and whether an agreed-key run's secrets were loaded from its store (a run started again)."""

    result: SimulationResult
    placement: dict | None = None
    restored: bool = False


class Backend:
    """One way of running a run. ``stacks``: runs of a sweep may share the replica axis (the runner's batches);
    ``in_process``: it runs in the runner's process (else it is started as processes of its own)."""

    name = ""
    stacks = False
    in_process = True

    def run(self, spec, c, *, on_step: Callable[[int], None] | None, checkpoints: Checkpoints | None,
            resume: bool, secrets: Path | None, store_identity: dict | None) -> Ran:
        """One run of ``spec`` (a :class:`~privdl.experiment.config.RunSpec`) with its built components ``c``;
        ``checkpoints`` / ``resume`` as :func:`privdl.simulate`; ``secrets`` / ``store_identity``: the folder of an
        agreed-key run's agent secrets and what they are bound to."""
        raise NotImplementedError


#: the backends by name (:class:`Backend` instances)
BACKENDS: Registry[Backend] = Registry("runtime backend")


def backend_of(cfg: dict) -> Backend:
    """The backend config ``cfg`` names (``runtime.backend``)."""
    return BACKENDS.get(RuntimeSpec.of(cfg).backend)


class Simulator(Backend):
    name, stacks = "simulator", True

    def run(self, spec, c, *, on_step, checkpoints, resume, secrets, store_identity) -> Ran:
        cfg = spec.config
        keys, restored, setup = None, False, 0.0
        agreed = RuntimeSpec.of(cfg).agreed
        if agreed:
            began = time.perf_counter()
            source = agree_alone(network=c.network, mechanism=c.mechanism, public=RootKeys(int(cfg["seed"])),
                                 context=spec.run_id, store=secrets, store_identity=store_identity,
                                 **config_options(cfg, c.network.n, range(c.network.n)))
            keys, restored, setup = Keys(source, c.network.n), source.restored, time.perf_counter() - began
        result = simulate(task=c.task, network=c.network, algorithm=c.algorithm, mechanism=c.mechanism,
                          schedule=c.schedule, iterations=cfg["iterations"], seed=None if agreed else cfg["seed"],
                          keys=keys,
                          eval_every=cfg["eval_every"], gradient=cfg["gradient"], sparse=c.sparse, on_step=on_step,
                          device=cfg.get("device", "cpu"), observers=observers(cfg, c, c.network.n),
                          checkpoints=checkpoints, resume=resume)
        return Ran(result, {"backend": "simulator", "setup_seconds": setup} if agreed else None, restored)


class Sliced(Backend):
    name = "sliced"

    def run(self, spec, c, *, on_step, checkpoints, resume, secrets, store_identity) -> Ran:
        cfg = spec.config
        runtime = RuntimeSpec.of(cfg)
        agreed = runtime.agreed
        placements = partition(c.network.n, slices=runtime.slices, assignment=runtime.assignment)
        if cfg.get("device", "cpu") != "cpu":
            raise ValidationError("runtime.backend = \"sliced\" runs on the CPU; remove device or set it to \"cpu\"")
        options = config_options(cfg, c.network.n, range(c.network.n)) if agreed else {}
        frame = runtime.frame or "network"  # the sliced backend's default: the simulator's shapes, bit for bit
        result = simulate_sliced(task=c.task, network=c.network, algorithm=c.algorithm, mechanism=c.mechanism,
                                 schedule=c.schedule, iterations=cfg["iterations"], seed=cfg["seed"],
                                 placements=placements, eval_every=cfg["eval_every"], gradient=cfg["gradient"],
                                 on_step=on_step, observers=observers(cfg, c, c.network.n), checkpoints=checkpoints,
                                 resume=resume, timeout=runtime.timeout, agreed=agreed,
                                 context=spec.run_id, store=secrets, store_identity=store_identity,
                                 frame=frame, **options)
        placement = {"backend": "sliced", "frame": frame, "slices": [list(p.agents) for p in placements],
                     "payload_bytes": result.extra["payload_bytes"],
                     "control_messages": result.extra["control_messages"]}
        if agreed:
            placement.update(setup_bytes=result.extra["setup_bytes"], setup_seconds=result.extra["setup_seconds"])
        return Ran(result, placement, bool(result.extra.get("restored", False)) if agreed else False)


class Dist(Backend):
    """Processes of their own (:func:`privdl.runtime.worker.run_one_distributed` runs each one's slice)."""

    name, in_process = "dist", False

    def run(self, spec, c, **_) -> Ran:
        raise ValidationError("runtime.backend = \"dist\" runs in several processes: start it with privdl run CONFIG "
                              "(which launches runtime.procs processes) or torchrun ... -m privdl.runtime CONFIG")


for _backend in (Simulator(), Sliced(), Dist()):
    BACKENDS.add(_backend.name, _backend)

__all__ = ["BACKENDS", "Backend", "EAVESDROPPER_WINDOW", "Ran", "backend_of", "observers"]
