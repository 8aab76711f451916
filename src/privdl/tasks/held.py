"""A task as an engine that holds only some agents sees it (a slice of the sliced backend, a process of the
distributed runtime): :func:`privdl.tasks.make_task` with ``agents=``; :mod:`privdl.simulator.sliced` gives each
slice one."""

from __future__ import annotations

import torch

from privdl.errors import ValidationError
from privdl.placement import Placement
from privdl.tasks.base import Task


class HeldTask:
    """A slice's view of a task: :meth:`Task.restrict` to its agents (its own round state; a supervised task keeps
    only their examples), and data access refused for any agent the slice does not hold (everything else — shapes,
    the loss, public counts — is the task's)."""

    def __init__(self, task: Task, placement: Placement) -> None:
        self._task = task.restrict(placement.agents)  # its own round state; only its agents' examples
        self._placement = placement
        self._passed: torch.Tensor | None = None  # _check's last passed agents

    def __getattr__(self, name: str):
        return getattr(self._task, name)

    def _check(self, agents: torch.Tensor) -> None:
        # the agents of the last access that passed, as a copy of its own: an access for the same agents (the held
        # frame's every round) passes on one comparison of the values (≈ 1 µs; the check ≈ 12 µs)
        passed = self._passed
        if (passed is not None and isinstance(agents, torch.Tensor) and agents.dtype == torch.int64
                and agents.device.type == "cpu" and agents.shape == passed.shape and torch.equal(agents, passed)):
            return
        a = torch.as_tensor(agents).reshape(-1).cpu().numpy()
        if a.size and not self._placement.held[a % self._placement.n].all():
            other = int(a[~self._placement.held[a % self._placement.n]][0])
            raise ValidationError(f"a slice holding agents {list(self._placement.agents)} asked for the data of "
                                  f"agent {other}")
        if isinstance(agents, torch.Tensor) and agents.dtype == torch.int64 and agents.device.type == "cpu":
            self._passed = agents.clone()

    def gather(self, agents, index):
        self._check(agents)
        return self._task.gather(agents, index)

    def sample(self, draws, agents):
        self._check(agents)
        return self._task.sample(draws, agents)

    def sample_subset(self, draws, agents, size):
        self._check(agents)
        return self._task.sample_subset(draws, agents, size)

    def sample_lot(self, draws, agents, rates, *, block=1):
        self._check(agents)
        return self._task.sample_lot(draws, agents, rates, block=block)

    def at_round(self, t: int) -> None:
        self._task.at_round(t)


__all__ = ["HeldTask"]
