"""Turn one effective run config into the objects the simulator needs (network, task, algorithm, ...)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from privdl.algorithms import Algorithm, make_algorithm
from privdl.mechanisms import Mechanism, make_mechanism
from privdl.network import Network, load_network_file
from privdl.schedules import Schedule, make_schedule
from privdl.tasks import Task, make_task

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class Components:
    network: Network
    task: Task
    algorithm: Algorithm
    mechanism: Mechanism
    schedule: Schedule
    sparse: bool | None


def _rest(table: dict, *drop: str) -> dict:
    return {k: v for k, v in table.items() if k not in drop}


def build_network(net: dict) -> Network:
    fixed = ("topology", "n", "mixing", "lazy", "seed", "file", "file_kind", "sparse")
    if net.get("file"):
        return load_network_file(net["file"], kind=net.get("file_kind", "auto"),
                                 mixing=net.get("mixing", "metropolis_hastings"), lazy=net.get("lazy", False))
    return Network.from_topology(net.get("topology", "erdos_renyi"), net.get("n", 10),
                                 mixing=net.get("mixing", "metropolis_hastings"), lazy=net.get("lazy", False),
                                 seed=net.get("seed", 0), **_rest(net, *fixed))


def build(cfg: dict) -> Components:
    network = build_network(cfg["network"])
    task = make_task(cfg["task"]["name"], network.n, dtype=DTYPES[cfg["dtype"]], **_rest(cfg["task"], "name"))
    algorithm = make_algorithm(cfg["algorithm"]["name"], **_rest(cfg["algorithm"], "name"))
    # privacy is accounted over every noisy access, which may exceed the iterations (inner steps, initialisation)
    mechanism = make_mechanism(cfg["mechanism"]["name"], steps=algorithm.gradient_calls(cfg["iterations"]),
                               network=network, task=task, **_rest(cfg["mechanism"], "name"))
    schedule = make_schedule(cfg["schedule"]["name"], iterations=cfg["iterations"], **_rest(cfg["schedule"], "name"))
    sparse = cfg["network"].get("sparse", "auto")
    return Components(network, task, algorithm, mechanism, schedule, None if sparse == "auto" else bool(sparse))
