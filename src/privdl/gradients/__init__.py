"""Gradients of a task's loss on the agent axis: per-row mini-batch gradients (closed forms or torch.func), per-example
gradients, and DP-SGD's clipped lot sums (ghost clipping through a per-layer registry, torch.func as the general
fallback). Used by the engine's data access; mechanisms never call them (they declare what they need)."""

from privdl.gradients.functional import (
    batch_gradient_fn, clipped_example_sum, per_agent_gradients, per_example_gradient_blocks, per_example_gradients,
)
from privdl.gradients.ghost import GHOST_RULES, ghost_clipped_sum, register_ghost, supports_ghost

__all__ = ["GHOST_RULES", "batch_gradient_fn", "clipped_example_sum", "ghost_clipped_sum", "per_agent_gradients",
           "per_example_gradient_blocks", "per_example_gradients", "register_ghost", "supports_ghost"]
