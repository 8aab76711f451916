"""One run from Python: :func:`train` and its :class:`Result`.

:func:`train` is ``privdl run`` for one run: its arguments become the run's config (the tables the config file
would hold, checked the same way; an object stands for its table), and the run goes through the runner's one
pipeline (:func:`privdl.experiment.run_pipeline.run_components`: build, threads, backend, privacy ledger, manifest). A
run given only names and tables has the id, the ledger and the manifest its config file would have under
``privdl run``; ``Result.save(DIR)`` writes ``DIR/manifest.json`` and ``DIR/metrics.csv`` as the runner writes a
run's folder, so ``privdl account --manifest DIR/manifest.json`` re-accounts it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import networkx as nx
import torch

from privdl.algorithms import Algorithm
from privdl.errors import ValidationError
from privdl.experiment.build import DTYPES, build
from privdl.experiment.config import RunSpec
from privdl.experiment.config_resolve import resolve_table, resolve_top
from privdl.experiment.run_identity import run_id
from privdl.experiment.run_pipeline import Finished, run_components
from privdl.experiment.store import write_runs
from privdl.mechanisms import GradientMechanism
from privdl.network import Network
from privdl.privacy.ledger import Ledger
from privdl.schedules import Schedule
from privdl.tasks import Task

#: the component sections of a run, the class an object given for each must be, and the key naming a table's choice
_SECTIONS: dict[str, tuple[type, str]] = {"network": (Network, "topology"), "task": (Task, "name"),
                                          "algorithm": (Algorithm, "name"), "mechanism": (GradientMechanism, "name"),
                                          "schedule": (Schedule, "name")}


@dataclass(frozen=True)
class Result:
    """What :func:`train` returns: one finished run.

    Attributes:
        metrics: the recorded metrics, one ``{"iteration", "metric", "value"}`` row each (rounds 0, every
            ``eval_every`` and the last).
        ledger: the run's privacy ledger (:class:`privdl.privacy.Ledger`: ``epsilon`` — the worst agent's —,
            ``guarantee``, ``per_agent()``), the very object whose ``to_dict()`` the manifest holds.
        models: the agents' final models, one flat parameter vector per agent (n, d); None for a run not trained.
        task: the task the run trained (its ``model`` turns a row of ``models`` back into a module: :meth:`module`).
    """

    metrics: list[dict]
    ledger: Ledger
    models: torch.Tensor | None
    task: Task
    _run: Finished

    def __repr__(self) -> str:
        agents = "" if self.models is None else f", agents={len(self.models)}"
        return (f"Result(run_id={self._run.manifest['run_id']!r}{agents}, guarantee={self.ledger.guarantee!r}, "
                f"final={self.final!r})")

    def manifest(self) -> dict:
        """The run's manifest (a copy): config, code, seeds, components' facts, privacy ledger, final metrics —
        what ``privdl run`` writes as ``runs/ID/manifest.json``."""
        return copy.deepcopy(self._run.manifest)

    @property
    def final(self) -> dict[str, float]:
        """The metrics at the last recorded round, by name."""
        return dict(self._run.manifest["final_metrics"])

    def module(self, agent: int = 0) -> torch.nn.Module:
        """Agent ``agent``'s final model as a ``torch.nn.Module`` (a copy of the task's module holding its
        parameters), for tasks with a module (:func:`privdl.task_from_arrays`, the config's supervised tasks)."""
        model = getattr(self.task, "model", None)
        if model is None or not hasattr(model, "module") or self.models is None:
            raise ValidationError(f"task {self.task.name!r} has no module (or the run was not trained): use models")
        if not 0 <= agent < len(self.models):
            raise ValidationError(f"agent must lie in 0..{len(self.models) - 1}, got {agent}")
        module = copy.deepcopy(model.module)
        with torch.no_grad():
            for p, block in zip(module.parameters(), model.split(self.models[agent])):
                p.copy_(block.to(p.dtype))
        return module

    def save(self, folder: str | Path) -> Path:
        """Write the run into ``folder`` (made if absent) as the runner writes a run's folder: ``manifest.json`` and
        ``metrics.csv``. Returns the manifest's path (``privdl account --manifest PATH`` re-accounts it)."""
        folder = Path(folder)
        write_runs([(folder, self._run.records, self._run.manifest)])
        return folder / "manifest.json"


def train(*, task: Task | dict | str, network: Network | nx.Graph | dict, algorithm: Algorithm | dict | str = "dsgd",
          mechanism: GradientMechanism | dict | str = "none", schedule: Schedule | dict | str, iterations: int,
          seed: int = 0, eval_every: int = 0, gradient: str = "auto", device: str = "cpu", threads: int = 0,
          on_step: Callable[[int], None] | None = None) -> Result:
    """Train one run: ``privdl run`` for one point of a config, from Python.

    Args:
        task: a Task (e.g. :func:`privdl.task_from_arrays`), a task name, or a ``[task]`` table as a dict
            (``{"name": "logistic", "dataset": "breast_cancer", "batch_size": 32}``).
        network: a :class:`privdl.Network`, a networkx graph (Metropolis–Hastings weights), or a ``[network]``
            table (``{"topology": "ring", "n": 8}``).
        algorithm: a registered name (``dsgd``, ``dsgt``, ...; :data:`privdl.ALGORITHMS`), a table with its keys,
            or an Algorithm.
        mechanism: a registered name, a table shaped like the config's ``[mechanism]`` (``{"name": "dp_sgd",
            "epsilon": 3.0, "delta": 1e-5, "clip": 1.0, "lot_size": 32}``: calibrated to the run's accesses), or a
            GradientMechanism built for them (``steps=algorithm.accesses(iterations, network.edges)``).
        schedule: the step sizes: a name with its table (``{"name": "constant", "eta": 0.1}``) or a Schedule.
        iterations: rounds T.
        seed: the run's root seed (every draw is keyed from it).
        eval_every: rounds between recorded metrics (0: only the first and the last round).
        gradient, device, threads: as the config's top-level keys (docs/CONFIG.md).
        on_step: called with t after every round.

    Returns:
        A :class:`Result`: metrics, the privacy ledger, the final models, the manifest, ``save(folder)``.

    Raises:
        ConfigError: a table with an unknown name (the error lists the valid names) or key, or a bad value.
        ValidationError: an object of the wrong kind, or components that do not fit together.
    """
    objects: dict[str, Any] = {}
    tables: dict[str, dict] = {}
    for section, given in (("network", network), ("task", task), ("algorithm", algorithm),
                           ("mechanism", mechanism), ("schedule", schedule)):
        if section == "network" and isinstance(given, nx.Graph):
            given = Network.from_graph(given)
        cls, key = _SECTIONS[section]
        if isinstance(given, str):
            given = {key: given}
        if isinstance(given, dict):
            tables[section] = resolve_table(section, dict(given))
        elif isinstance(given, cls):
            objects[section] = given
            tables[section] = _stands_for(section, given)
        else:
            raise ValidationError(f"{section} must be a registered name, a table (dict) or a {cls.__name__}, got "
                                  f"{type(given).__name__}")
    dtype = next((k for k, v in DTYPES.items() if v == objects["task"].dtype), "float64") if "task" in objects \
        else "float64"
    cfg = {**resolve_top({"name": "train", "seed": seed, "iterations": iterations, "eval_every": eval_every,
                          "dtype": dtype, "gradient": gradient, "device": device, "threads": threads}), **tables}
    c = build(cfg, **objects)
    done = run_components(RunSpec(run_id(cfg), cfg, {}), c, on_step)
    rows = [{"iteration": t, "metric": m, "value": v} for t, m, v in done.records]
    return Result(rows, done.ledger, done.models, c.task, done)


def _stands_for(section: str, obj: Any) -> dict:
    """The config table an object stands for in the run's config (and its id): its name and class — and, for a
    network, its W's fingerprint."""
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if section == "network":
        return {"object": kind, "description": obj.description, "W_fingerprint": obj.fingerprint}
    return {"name": obj.name, "object": kind}

