"""The engine's data access: the only code that reads the agents' data (DESIGN.md, "gradient side").

``GradientOracle(models, owners=, tag=)`` is what an algorithm calls through its context: it evaluates the gradient
the mechanism needs at ``models`` (m, d) on the data of ``owners`` (m global rows; default: each row its own data),
keyed per owner, then lets the mechanism protect it. Every call is one noisy access per row, counted against the
owner's budget, with index ``call`` (1, 2, …, the same in every process of a run) that keys the draws:

* mini-batches: purpose ``batch``, key (call, owner, requester) — uniform with replacement from the owner's data
  (or, for a per-example clipped batch, distinct examples from the same uniforms: Task.sample_subset);
* Poisson lots: purpose ``lot``, same key — example k of the owner joins when its k-th uniform is below q;
* noise: the mechanism's own purpose (``noise``), same key.

``owners`` ≠ rows is a cross-gradient: agent j's data at agent i's model (DPDL). Nothing here depends on n or on
another owner's data size, so agent i's draws are the same whatever the rest of the network is.
"""

from __future__ import annotations

import torch

from privdl.errors import ValidationError
from privdl.gradients import batch_gradient_fn, clipped_example_sum, ghost_clipped_sum, supports_ghost
from privdl.keys import Draws, Keys
from privdl.mechanisms.base import Access, BatchGradient, ClippedSum, GradientMechanism
from privdl.tasks.base import Task

#: numbers per parameter block processed at once by the generic per-example path (m · chunk · d ≤ this)
CHUNK_BUDGET = 2**22


class GradientOracle:
    """Privatised gradients for the algorithm: ``oracle(models, owners=None, tag=...)`` → (m, d)."""

    def __init__(self, task: Task, mechanism: GradientMechanism, keys: Keys, *, gradient: str = "auto") -> None:
        self.task, self.mechanism, self.keys = task, mechanism, keys
        self.calls = 0
        self._all: torch.Tensor | None = None
        self._batch_grad = batch_gradient_fn(task, gradient)
        need = mechanism.need
        if isinstance(need, ClippedSum):
            if not task.examples:
                raise ValidationError(f"mechanism {mechanism.name!r} clips per example; task {task.name!r} has no "
                                      "examples to sample lots from")
            method = need.method
            if method == "ghost" and not supports_ghost(task):
                raise ValidationError(f"ghost clipping does not support task {task.name!r} (model layers or L2 "
                                      "term); use per_example = 'vmap'")
            if method == "closed_form" and not task.has_closed_form_clipped_sum():
                raise ValidationError(f"task {task.name!r} has no closed-form clipped sum (linear models without "
                                      "L2 have one); use per_example = 'ghost' or 'vmap'")
            if method == "auto":
                method = ("closed_form" if task.has_closed_form_clipped_sum() else
                          "ghost" if supports_ghost(task) else "vmap")
            self.per_example = method

    def _agents(self, owners: torch.Tensor) -> torch.Tensor:
        if owners is self._all and self.task.n == len(owners):
            return owners
        return owners.cpu() % self.task.n

    def _check(self, rows: int, owners: torch.Tensor | None,
               requesters: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if owners is None:
            if rows != self.keys.rows:
                raise ValidationError(f"models have {rows} rows, the run has {self.keys.rows}: pass owners= for a "
                                      "subset or for cross-gradients")
            owners = torch.arange(rows)
        owners = torch.as_tensor(owners).reshape(-1).cpu().to(torch.int64)
        if owners.numel() != rows:
            raise ValidationError(f"owners= needs one data owner per model row ({rows}), got {owners.numel()}")
        if requesters is None:
            requesters = torch.arange(rows) if rows == self.keys.rows else owners.clone()
        requesters = torch.as_tensor(requesters).reshape(-1).cpu().to(torch.int64)
        if requesters.numel() != rows:
            raise ValidationError(f"requesters= needs one entry per model row ({rows}), got {requesters.numel()}")
        for name, idx in (("owners", owners), ("requesters", requesters)):
            if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.keys.rows):
                raise ValidationError(f"{name} must be rows 0..{self.keys.rows - 1}")
        return owners, requesters

    def __call__(self, models: torch.Tensor, *, owners: torch.Tensor | None = None,
                 requesters: torch.Tensor | None = None, tag: str = "gradient", protect: bool = True) -> torch.Tensor:
        """One noisy access: row r of ``models`` evaluated on the data of ``owners[r]`` (default: row r's own), at
        the model of agent ``requesters[r]`` (default: row r when there is one model per row of the run, else the
        owner itself). ``protect=False`` is an access without the mechanism's noise (seed 003's published DPDL
        self-gradient): its own draws (a call index of its own), not counted against the privacy budget, released
        by :meth:`GradientMechanism.unprotected` — the algorithm must declare it (``Algorithm.unprotected``), and
        the ledger then states that no ε covers the agent."""
        rows = models.shape[0]
        everyone = owners is None and requesters is None and rows == self.keys.rows
        if everyone:  # the common case: every row, its own data, its own model
            if self._all is None:
                self._all = torch.arange(rows)
            owners = requesters = self._all
        else:
            owners, requesters = self._check(rows, owners, requesters)
            everyone = rows == self.keys.rows and Access(owners=owners, requesters=requesters, call=0).all_rows
        self.calls += 1
        access = Access(owners=owners, requesters=requesters, call=self.calls, everyone=everyone)
        if protect:
            self.mechanism.count(access)
        need = self.mechanism.need
        self._everyone = everyone
        if isinstance(need, BatchGradient):
            batch = self.task.sample(self._draws("batch", owners, requesters), self._agents(owners))
            value = self._batch_grad(models, batch)
        elif isinstance(need, ClippedSum):
            value = self.clipped_sum(models, owners, requesters, need)
        else:  # pragma: no cover - the Need union is closed
            raise ValidationError(f"unknown need {need!r}")
        return self.mechanism.privatize(value, access) if protect else self.mechanism.unprotected(value, access)

    def _draws(self, purpose: str, owners: torch.Tensor, requesters: torch.Tensor) -> Draws:
        if self._everyone:  # every row for itself: the keys' deduplicated fast path
            return Draws(self.keys, purpose, self.calls)
        return Draws(self.keys, purpose, self.calls, owners.numpy(), requesters.numpy())

    def clipped_sum(self, models: torch.Tensor, owners: torch.Tensor, requesters: torch.Tensor,
                    need: ClippedSum) -> torch.Tensor:
        if need.batch is not None:  # a uniform batch of distinct examples, from the mini-batch key
            batch, mask = self.task.sample_subset(self._draws("batch", owners, requesters), self._agents(owners),
                                                  need.batch)
        else:
            rates = need.rates.reshape(-1)
            row_rates = rates.index_select(0, owners % rates.numel())
            batch, mask = self.task.sample_lot(self._draws("lot", owners, requesters), self._agents(owners),
                                               row_rates)
        mask = mask.to(models.dtype)
        clip = need.clip
        if self.per_example == "closed_form":
            return self.task.clipped_sum(models, batch, mask, clip)
        if self.per_example == "ghost":
            return ghost_clipped_sum(self.task, models, batch, mask, clip)
        m, d = models.shape
        chunk = need.chunk or max(1, CHUNK_BUDGET // max(1, m * d))
        return clipped_example_sum(self.task, models, batch, mask, clip, chunk)


__all__ = ["CHUNK_BUDGET", "GradientOracle"]
