"""The agent-axis simulator."""

from privdl.simulator.engine import SimulationResult, checkpoints, simulate
from privdl.simulator.gradients import gradient_oracle, per_agent_gradients, per_example_gradients

__all__ = ["SimulationResult", "checkpoints", "gradient_oracle", "per_agent_gradients", "per_example_gradients",
           "simulate"]
