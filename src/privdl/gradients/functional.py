"""Per-row and per-example gradients through torch.func (no Python loop over rows): the general path, for any
model whose loss ``vmap`` can batch.

Per-example gradients are taken with respect to the model's parameter *blocks* (weight, bias, ...), not the flat
vector: differentiating through the slices of a flat vector makes autograd build and add one full-size (n, B, d)
zero tensor per block, which costs several times the gradient itself. DP-SGD then clips and sums block by block
and concatenates only the (n, d) result.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.func import grad, vmap

from privdl.errors import ValidationError
from privdl.tasks.base import Batch, Task


def per_agent_gradients(task: Task, x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """∇ loss(x_r; batch_r) for every row r: ``vmap(grad(loss))`` over the rows → (m, d)."""
    return vmap(grad(task.loss))(x, *batch)


def per_example_gradient_blocks(task: Task, x: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, ...]:
    """∇ loss(x_i; example_ib) for every agent i and example b, one tensor (n, B, *block shape) per parameter
    block, through two nested vmaps."""

    def example_loss(blocks: tuple[torch.Tensor, ...], *example: torch.Tensor) -> torch.Tensor:
        return task.block_loss(blocks, *(e.unsqueeze(0) for e in example))

    k = len(batch)
    inner = vmap(grad(example_loss), in_dims=(None,) + (0,) * k)
    return vmap(inner, in_dims=(0,) + (0,) * k)(task.blocks(x), *batch)


def per_example_gradients(task: Task, x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Per-example gradients as flat vectors (n, B, d)."""
    blocks = per_example_gradient_blocks(task, x, batch)
    n, b = blocks[0].shape[:2]
    return torch.cat([g.reshape(n, b, -1) for g in blocks], dim=2)


def clipped_example_sum(task: Task, x: torch.Tensor, batch: Batch, mask: torch.Tensor, clip: float | None,
                        chunk: int | None = None) -> torch.Tensor:
    """Σ_b mask_ib · min(1, C/‖g_ib‖) · g_ib for every agent i (DP-SGD's clipped lot sum), (n, d).

    ``clip=None`` sums unclipped gradients (a deliberately broken mechanism for audits). ``chunk`` bounds the
    examples per agent processed at once (memory ≈ n · chunk · d numbers)."""
    n, size = mask.shape
    step = size if not chunk or chunk >= size else chunk
    total: list[torch.Tensor] | None = None
    for start in range(0, size, step):
        part = tuple(t[:, start:start + step] for t in batch)
        m = mask[:, start:start + step]
        blocks = per_example_gradient_blocks(task, x, part)
        flat = [g.reshape(n, g.shape[1], -1) for g in blocks]
        weight = m
        if clip is not None:
            sq = sum(torch.linalg.vector_norm(g, dim=2) ** 2 for g in flat)
            weight = m * torch.clamp(clip / sq.sqrt().clamp_min(torch.finfo(x.dtype).tiny), max=1.0)
        sums = [torch.einsum("nb,nbd->nd", weight, g) for g in flat]
        total = sums if total is None else [a + s for a, s in zip(total, sums)]
    assert total is not None
    return torch.cat(total, dim=1)


def batch_gradient_fn(task: Task, method: str = "auto") -> Callable[[torch.Tensor, Batch], torch.Tensor]:
    """The per-row mini-batch gradient function: the task's closed form (``closed_form``), torch.func
    (``torch_func``), or the closed form when the task has one (``auto``). The task's ``loss`` (or
    ``batched_grad``) is bound when this is called — once per run, by the oracle —: replacing it on the task
    afterwards does not reach the function returned."""
    if method not in ("auto", "closed_form", "torch_func"):
        raise ValidationError(f"unknown gradient method {method!r}; valid: auto, closed_form, torch_func")
    has_closed = task.has_closed_form_gradient()
    if method == "torch_func" or (method == "auto" and not has_closed):
        per_row = vmap(grad(task.loss))  # made once per run, not per access (the transforms' set-up is Python)
        return lambda x, batch: per_row(x, *batch)
    if not has_closed:
        raise ValidationError(f"task {task.name!r} has no closed-form gradient; use gradient = 'torch_func'")
    return task.batched_grad  # type: ignore[return-value]
