"""The agent-axis simulator: one loop for single runs, copies (audits) and stacked replicas (sweeps)."""

from privdl.simulator.access import GradientOracle
from privdl.simulator.engine import (
    Replica, ReplicaResult, SimulationResult, checkpoints, resolve_device, simulate, simulate_replicas, stackable,
)

__all__ = ["GradientOracle", "Replica", "ReplicaResult", "SimulationResult", "checkpoints", "resolve_device",
           "simulate", "simulate_replicas", "stackable"]


def __getattr__(name: str) -> object:
    from privdl.moved import moved_attribute

    raise moved_attribute(__name__, name)
