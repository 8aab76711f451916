"""Tasks: the rotated quadratic, logistic / softmax regression, MLP (loss + data + metrics)."""

from typing import Sequence

from privdl.placement import Placement
from privdl.tasks import quadratic, streaming, supervised  # noqa: F401  (register tasks)
from privdl.tasks.base import TASKS, Task
from privdl.tasks.held import HeldTask
from privdl.tasks.quadratic import Quadratic, quadratic_optimum, quadratic_problem


def make_task(name: str, n: int, *, agents: Sequence[int] | None = None, **params: object) -> Task:
    """Build the registered task ``name`` for ``n`` agents. ``agents``: the task as an engine holding only those
    agents sees it (:class:`privdl.tasks.held.HeldTask`): the same shapes, loss and public counts, and no way
    to read another agent's examples (a dataset loaded whole for the partition still lies in memory)."""
    task = TASKS.build(name, n, **params)
    if agents is None:
        return task
    return HeldTask(task, Placement(n, tuple(agents)))


__all__ = ["TASKS", "HeldTask", "Quadratic", "Task", "make_task", "quadratic_optimum", "quadratic_problem"]
