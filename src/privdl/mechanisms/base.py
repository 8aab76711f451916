"""The Mechanism interface: what an agent does to its gradient before it leaves (clip + noise), plus its ledger.

Mechanisms act on the agent axis, g (n, d) -> (n, d), and never know which algorithm calls them; algorithms never
know which mechanism they use (DESIGN.md: adding one must not touch the other).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable

import torch

from privdl.privacy.ledger import LedgerEntry, non_private
from privdl.registry import Registry
from privdl.rng import Streams

if TYPE_CHECKING:
    from privdl.tasks.base import Task


def clip_rows(g: torch.Tensor, clip: float | torch.Tensor) -> torch.Tensor:
    """ĝ_i = min(1, C/‖g_i‖)·g_i for every row (agent) i; ``clip`` may be a per-row (rows, 1) tensor."""
    norms = torch.linalg.vector_norm(g, dim=1, keepdim=True)
    return g * torch.clamp(clip / norms.clamp_min(torch.finfo(g.dtype).tiny), max=1.0)


class Mechanism(ABC):
    name: str = "mechanism"

    @abstractmethod
    def privatize(self, g: torch.Tensor, t: int, generator: torch.Generator) -> torch.Tensor:
        """The privatised gradients the agents use and share at step t."""

    @abstractmethod
    def ledger(self) -> list[LedgerEntry]:
        """Privacy statements for a run of the configured length."""

    def noisy_gradient(self, task: "Task", x: torch.Tensor, t: int, batch_gen: torch.Generator,
                       noise_gen: torch.Generator, oracle: Callable) -> torch.Tensor:
        """One noisy access to every agent's data at models x (n, d): by default a mini-batch gradient from
        ``oracle`` privatised with :meth:`privatize`; example-level mechanisms override it (they need the
        per-example gradients). Each call draws a fresh batch and fresh noise."""
        return self.privatize(oracle(x, task.sample(batch_gen)), t, noise_gen)

    def start(self, streams: Streams) -> None:
        """Called once before the first step with the run's keyed streams (mechanisms that draw from per-agent or
        shared keys keep them; the default draws from the ``generator`` passed to :meth:`privatize`)."""

    def describe(self) -> dict[str, object]:
        return {"name": self.name}


class NoPrivacy(Mechanism):
    """Gradients pass unchanged (non-private baselines)."""

    name = "none"

    def __init__(self, *, steps: int) -> None:
        self.steps = steps

    def privatize(self, g: torch.Tensor, t: int, generator: torch.Generator) -> torch.Tensor:
        return g

    def ledger(self) -> list[LedgerEntry]:
        return [non_private(self.name, self.steps)]


MECHANISMS: Registry[Callable[..., Mechanism]] = Registry("mechanism")
MECHANISMS.add("none", NoPrivacy)
