"""The agent-axis simulator: one loop for single runs, copies (audits) and stacked replicas (sweeps)."""

from privdl.simulator.access import GradientOracle
from privdl.simulator.checkpoint import CheckpointError, Checkpoints, RunState
from privdl.simulator.engine import (
    Replica, ReplicaResult, SimulationResult, recorded_rounds, simulate, simulate_replicas,
    stackable,
)
from privdl.simulator.sliced import simulate_sliced

__all__ = ["CheckpointError", "Checkpoints", "GradientOracle", "Replica", "ReplicaResult", "RunState",
           "SimulationResult", "recorded_rounds", "simulate", "simulate_replicas",
           "simulate_sliced", "stackable"]
