"""The Task interface: a loss per agent, a way to draw every agent's mini-batch at once, metrics.

Parameters are flat vectors: agent i's model is row i of an (n, d) tensor (the agent axis of DESIGN.md).
``loss(theta, *batch)`` is written for one agent and one batch (mean over the batch) so that torch.func can
batch it over agents (``vmap(grad(loss))``) and over examples (per-example gradients).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch

from privdl.errors import ValidationError
from privdl.registry import Registry

Batch = tuple[torch.Tensor, ...]


class Task(ABC):
    """A learning problem split over ``n`` agents."""

    name: str = "task"
    n: int
    dim: int
    dtype: torch.dtype = torch.float64
    device: torch.device = torch.device("cpu")

    @abstractmethod
    def init_params(self, generator: torch.Generator) -> torch.Tensor:
        """The common initial model (d,)."""

    @abstractmethod
    def loss(self, theta: torch.Tensor, *batch: torch.Tensor) -> torch.Tensor:
        """Mean loss of one agent's model ``theta`` (d,) on one batch (tensors with a leading example axis)."""

    def blocks(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The parameter blocks (weight, bias, ...) of the agents' models x (n, d) as views (n, *block shape);
        per-example gradients are taken block by block. Default: one block, x itself."""
        return (x,)

    def block_loss(self, blocks: tuple[torch.Tensor, ...], *batch: torch.Tensor) -> torch.Tensor:
        """:meth:`loss` of one agent's model given as its blocks (inverse of :meth:`blocks`)."""
        return self.loss(blocks[0], *batch)

    @abstractmethod
    def sample(self, generator: torch.Generator) -> Batch:
        """Every agent's mini-batch: tensors with leading axes (n, B)."""

    def sample_replicas(self, generator: torch.Generator, reps: int) -> Batch:
        """Mini-batches for ``reps`` independent copies of the agents: leading axes (reps·n, B)."""
        batches = [self.sample(generator) for _ in range(reps)]
        return tuple(torch.cat(parts, dim=0) for parts in zip(*batches))

    @abstractmethod
    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        """Metrics of the agents' models x (n, d), e.g. test loss averaged over agents."""

    def batched_grad(self, x: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        """Optional closed-form per-agent mini-batch gradients (n, d); None means use torch.func."""
        return None

    def to(self, device: str | torch.device) -> "Task":
        """Move the task's tensors to ``device`` (an accelerator); returns self. Random draws stay on the CPU."""
        if torch.device(device).type != "cpu":
            raise ValidationError(f"task {self.name!r} runs on the CPU only (asked for device {device!r})")
        return self

    def describe(self) -> dict[str, object]:
        """Facts for the manifest (sizes per agent, dimension...)."""
        return {"name": self.name, "n": self.n, "dim": self.dim}


TASKS: Registry[Callable[..., Task]] = Registry("task")


def consensus_distance(x: torch.Tensor) -> float:
    """(1/n) Σ_i ‖x_i − x̄‖²."""
    return float(((x - x.mean(dim=0, keepdim=True)) ** 2).sum(dim=1).mean())
