"""Per-agent and per-example gradients on the agent axis through torch.func (no Python loop over agents)."""

from __future__ import annotations

from typing import Callable

import torch
from torch.func import grad, vmap

from privdl.tasks.base import Batch, Task


def per_agent_gradients(task: Task, x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """∇ loss_i(x_i; batch_i) for every agent i: ``vmap(grad(loss))`` over the agent axis → (n, d)."""
    return vmap(grad(task.loss))(x, *batch)


def per_example_gradients(task: Task, x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """∇ loss(x_i; example_ib) for every agent i and example b: two nested vmaps → (n, B, d)."""

    def example_loss(theta: torch.Tensor, *example: torch.Tensor) -> torch.Tensor:
        return task.loss(theta, *(e.unsqueeze(0) for e in example))

    k = len(batch)
    inner = vmap(grad(example_loss), in_dims=(None,) + (0,) * k)
    return vmap(inner, in_dims=(0,) + (0,) * k)(x, *batch)


def gradient_oracle(task: Task, method: str = "auto") -> Callable[[torch.Tensor, Batch], torch.Tensor]:
    """The per-agent gradient function: the task's closed form (``closed_form``), torch.func (``torch_func``),
    or the closed form when the task has one (``auto``)."""
    if method not in ("auto", "closed_form", "torch_func"):
        from privdl.errors import ValidationError

        raise ValidationError(f"unknown gradient method {method!r}; valid: auto, closed_form, torch_func")
    probe = task.batched_grad(torch.zeros(task.n, task.dim, dtype=task.dtype), task.sample(torch.Generator()))
    if method == "torch_func" or (method == "auto" and probe is None):
        return lambda x, batch: per_agent_gradients(task, x, batch)
    if probe is None:
        from privdl.errors import ValidationError

        raise ValidationError(f"task {task.name!r} has no closed-form gradient; use gradient = 'torch_func'")
    return task.batched_grad  # type: ignore[return-value]
