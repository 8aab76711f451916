"""The Mechanism interface: what an agent does to its gradient before it leaves (clip + noise), plus its ledger.

Mechanisms act on the agent axis, g (n, d) -> (n, d), and never know which algorithm calls them; algorithms never
know which mechanism they use (DESIGN.md: adding one must not touch the other).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable

import torch

from privdl.errors import ValidationError
from privdl.privacy.ledger import LedgerEntry, non_private
from privdl.registry import Registry
from privdl.rng import Streams

if TYPE_CHECKING:
    from privdl.tasks.base import Task


def clip_rows(g: torch.Tensor, clip: float | torch.Tensor) -> torch.Tensor:
    """ĝ_i = min(1, C/‖g_i‖)·g_i for every row (agent) i; ``clip`` may be a per-row (rows, 1) tensor."""
    norms = torch.linalg.vector_norm(g, dim=1, keepdim=True)
    return g * torch.clamp(clip / norms.clamp_min(torch.finfo(g.dtype).tiny), max=1.0)


class AccessBudgetExceeded(ValidationError):
    """More noisy data accesses than the privacy accounting covers."""


class Mechanism(ABC):
    """``steps`` is the number of noisy accesses the privacy accounting covers; a run that makes more is stopped."""

    name: str = "mechanism"
    steps: int
    calls: int = 0

    @abstractmethod
    def privatize(self, g: torch.Tensor, t: int, generator: torch.Generator) -> torch.Tensor:
        """The privatised gradients the agents use and share at noisy access t (= the round when an algorithm makes
        one access per round); keyed noise must depend on t so that two accesses never reuse a draw."""

    @abstractmethod
    def ledger(self) -> list[LedgerEntry]:
        """Privacy statements for a run of the configured length."""

    def noisy_gradient(self, task: "Task", x: torch.Tensor, t: int, batch_gen: torch.Generator,
                       noise_gen: torch.Generator, oracle: Callable) -> torch.Tensor:
        """One noisy access to every agent's data at models x (n, d): by default a mini-batch gradient from
        ``oracle`` privatised with :meth:`privatize`; example-level mechanisms override it (they need the
        per-example gradients). Each call draws a fresh batch and fresh noise, and counts against ``steps``."""
        return self.privatize(oracle(x, task.sample(batch_gen)), self.next_access(), noise_gen)

    def next_access(self) -> int:
        """Count one noisy access (1, 2, ...); refuse one beyond what the accounting covers."""
        self.calls += 1
        if self.calls > self.steps:
            raise AccessBudgetExceeded(
                f"noisy access {self.calls} exceeds the {self.steps} accesses the privacy accounting of "
                f"{self.name!r} covers (an algorithm that reads the data more often than declared?)")
        return self.calls

    def start(self, streams: Streams) -> None:
        """Called once before the first step with the run's keyed streams (mechanisms that draw from per-agent or
        shared keys keep them; the default draws from the ``generator`` passed to :meth:`privatize`). Resets the
        access count."""
        self.calls = 0

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
