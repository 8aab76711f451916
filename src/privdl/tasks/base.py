"""The Task interface: a loss per agent, how an agent's batch is drawn from its own keyed draws, metrics.

Parameters are flat vectors: agent i's model is row i of an (n, d) tensor (the agent axis of DESIGN.md).
``loss(theta, *batch)`` is written for one agent and one batch (mean over the batch) so that torch.func can
batch it over agents (``vmap(grad(loss))``) and over examples (per-example gradients).

Data access is the engine's (``privdl.simulator.access``): it hands the task the data owners of an access (task
agent indices, one per row) and their keyed :class:`privdl.keys.Draws`; the task returns the batch. So agent i's
mini-batch depends only on its own key and its own data size — never on another agent's.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import Callable, Sequence

import torch

from privdl.errors import ValidationError
from privdl.keys import Draws
from privdl.registry import Registry

Batch = tuple[torch.Tensor, ...]


class Task(ABC):
    """A learning problem split over ``n`` agents; agent i holds ``counts[i]`` examples."""

    name: str = "task"
    n: int
    dim: int
    dtype: torch.dtype = torch.float64
    device: torch.device = torch.device("cpu")
    batch_size: int = 1
    #: whether the task has examples to sample lots from and clip one by one (example-level DP)
    examples: bool = True
    #: metrics whose running average the engine adds as ``<name>_avg`` (mean over the recorded rounds before t)
    running: tuple[str, ...] = ()
    #: the running averages' names where they are not ``<name>_avg`` (e.g. {"gap": "avg_gap"})
    running_names: dict[str, str] = {}

    def at_round(self, t: int) -> None:
        """Called by the engine before round t (and with 0 before ``init``): tasks whose data change with time
        (streams) follow it; others ignore it."""

    @property
    def counts(self) -> torch.Tensor:
        """Examples held by every agent, (n,) int64 on the CPU."""
        raise NotImplementedError

    def restrict(self, agents: Sequence[int]) -> "Task":
        """A copy of this task for an engine that holds only ``agents`` (privdl.placement): its own round state and,
        where the task keeps its agents' examples apart, only theirs (the others' are dropped). Default: a copy."""
        return copy.copy(self)

    @abstractmethod
    def init_params(self, generator: torch.Generator) -> torch.Tensor:
        """The common initial model (d,)."""

    @abstractmethod
    def loss(self, theta: torch.Tensor, *batch: torch.Tensor) -> torch.Tensor:
        """Mean loss of one agent's model ``theta`` (d,) on one batch (tensors with a leading example axis)."""

    def blocks(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The parameter blocks (weight, bias, ...) of the models x (m, d) as views (m, *block shape);
        per-example gradients are taken block by block. Default: one block, x itself."""
        return (x,)

    def block_loss(self, blocks: tuple[torch.Tensor, ...], *batch: torch.Tensor) -> torch.Tensor:
        """:meth:`loss` of one agent's model given as its blocks (inverse of :meth:`blocks`)."""
        return self.loss(blocks[0], *batch)

    @abstractmethod
    def gather(self, agents: torch.Tensor, index: torch.Tensor) -> Batch:
        """Examples ``index`` (m, K) (positions in each agent's own data) of the agents ``agents`` (m,):
        tensors with leading axes (m, K)."""

    def sample(self, draws: Draws, agents: torch.Tensor) -> Batch:
        """A mini-batch of ``batch_size`` examples per row, drawn uniformly with replacement from the row's agent's
        data: example ⌊u·m_agent⌋ for each of the row's keyed uniforms u."""
        u = draws.uniform(self.batch_size)
        idx = (u * self.counts.index_select(0, agents.cpu())[:, None]).long()
        return self.gather(agents, idx)

    def sample_subset(self, draws: Draws, agents: torch.Tensor, size: int) -> tuple[Batch, torch.Tensor]:
        """A uniform batch of min(size, m) *distinct* examples per row (what a shuffled data loader's first batch
        is). From the row's keyed uniforms u_0, u_1, …: the first example is ⌊u_0·m⌋ — the one :meth:`sample` draws
        from the same key — and the others are the size − 1 examples with the smallest u_{1+k} among the remaining
        m − 1 (a uniform subset of them), so the batch is a uniform size-subset. Returns the batch (m, size, ...) and
        a 0/1 mask (m, size) (rows with fewer than ``size`` examples use them all)."""
        agents = agents.cpu()
        counts = self.counts.index_select(0, agents)
        k = int(size)
        width = max(int(counts.max()), k)
        u = draws.uniform(1 + width)
        first = (u[:, 0] * counts).long().clamp(max=(counts - 1).clamp(min=0))
        order = u[:, 1:].clone()
        pos = torch.arange(width)[None, :]
        order[pos >= counts[:, None]] = 2.0  # not an example of this row
        order.scatter_(1, first[:, None], 3.0)  # already drawn
        rest = torch.topk(order, k - 1, dim=1, largest=False, sorted=True).indices
        idx = torch.cat([first[:, None], rest], dim=1)
        mask = torch.arange(k)[None, :] < counts[:, None]
        idx = torch.where(mask, idx, torch.zeros_like(idx))  # padding points at a real example, masked
        return self.gather(agents, idx), mask.to(self.dtype).to(self.device)

    def _lot_positions(self, draws: Draws, counts: torch.Tensor, rates: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Which positions join each row's lot ((m, size) bool; None: the whole data) and size = the largest
        count."""
        size = int(counts.max()) if counts.numel() else 0
        if bool((rates >= 1).all()):  # whole data, no draw
            return None, size
        pos = torch.arange(size)[None, :]
        u = draws.uniform(size)
        return (u < rates.to(torch.float64).cpu()[:, None]) & (pos < counts[:, None]), size

    def sample_lot(self, draws: Draws, agents: torch.Tensor, rates: torch.Tensor, *, block: int = 1
                   ) -> tuple[Batch, torch.Tensor]:
        """Poisson sampling (DP-SGD's lots): each of the row's agent's m examples joins independently with
        probability ``rates[row]`` — example k joins when the row's k-th keyed uniform is below the rate. Lots are
        padded to the rows' largest one (a slice's rows: its own agents' largest), rounded up to a multiple of
        ``block``; returns the batch (m, K, ...) and a 0/1 mask (m, K) of real entries, examples in increasing
        position."""
        agents = agents.cpu()
        counts = self.counts.index_select(0, agents)
        include, size = self._lot_positions(draws, counts, rates)
        pos = torch.arange(size)[None, :]
        if include is None:
            k = -(-size // block) * block
            idx = torch.arange(k)[None, :].expand(len(agents), k)
            mask = idx < counts[:, None]
            idx = torch.where(mask, idx, size)
        else:
            longest = int(include.sum(1).max())
            k = max(-(-longest // block) * block, 1)
            idx = torch.where(include, pos, size).sort(dim=1).values[:, :k]
            if idx.shape[1] < k:  # rounded up past the last position
                idx = torch.cat([idx, torch.full((len(agents), k - idx.shape[1]), size, dtype=idx.dtype)], dim=1)
            mask = idx < size
        idx = torch.minimum(idx, (counts - 1).clamp(min=0)[:, None])  # padding points at a real example, masked
        return self.gather(agents, idx), mask.to(self.dtype).to(self.device)

    @abstractmethod
    def metrics(self, x: torch.Tensor) -> dict[str, float]:
        """Metrics of the agents' models x (n, d), e.g. test loss averaged over agents."""

    def metrics_many(self, x: torch.Tensor) -> list[dict[str, float]]:
        """:meth:`metrics` of R systems (stacked replicas), x (R, n, d); tasks may evaluate them at once."""
        return [self.metrics(x[r]) for r in range(x.shape[0])]

    # ---- metrics evaluated where the agents live (the distributed runtime: privdl.simulator.coordinator) ----------
    # A task may split :meth:`metrics` into what each process computes from its own agents' models and what needs
    # their average x̄: per-agent terms whose mean over the agents is a metric (:meth:`agent_terms`), metrics of x̄
    # (:meth:`mean_terms`), and how they join (:meth:`join_metrics`, with the consensus distance (1/n) Σ‖x_i − x̄‖²,
    # which the coordinator computes). A task that does not (agent_terms None) has its models gathered instead.

    def agent_terms(self, x: torch.Tensor, agents: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """For the models x (m, d) of the agents ``agents`` (m,): one float64 value per row and name, each name a
        metric that is the mean of its values over all n agents (before :meth:`join_metrics`). None (the default):
        this task's metrics are not split."""
        return None

    def mean_term_names(self) -> tuple[str, ...]:
        """The names :meth:`mean_terms` returns, in its order."""
        return ()

    def mean_terms(self, mean: torch.Tensor) -> dict[str, float]:
        """The metrics of the agents' average model ``mean`` (d,)."""
        return {}

    def join_metrics(self, means: dict[str, float], consensus: float, at_mean: dict[str, float]) -> dict[str, float]:
        """:meth:`metrics` from its parts: ``means`` (the mean over the agents of each :meth:`agent_terms`),
        ``consensus`` ((1/n) Σ‖x_i − x̄‖²) and ``at_mean`` (:meth:`mean_terms`)."""
        raise NotImplementedError

    def batched_grad(self, x: torch.Tensor, batch: Batch) -> torch.Tensor | None:
        """Optional closed-form per-row mini-batch gradients (m, d); None means use torch.func."""
        return None

    def has_closed_form_gradient(self) -> bool:
        return False

    def clipped_sum(self, x: torch.Tensor, batch: Batch, mask: torch.Tensor,
                    clip: float | None) -> torch.Tensor | None:
        """Optional closed form of Σ_b mask_b·min(1, C/‖∇l(x; b)‖)·∇l(x; b) per row (m, d); None: the engine's
        per-example paths (ghost clipping, torch.func) compute it."""
        return None

    def has_closed_form_clipped_sum(self) -> bool:
        return False

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
