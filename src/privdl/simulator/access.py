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

from typing import Callable

import torch

from privdl.errors import ValidationError
from privdl.gradients import batch_gradient_fn, clipped_example_sum, ghost_clipped_sum, supports_ghost
from privdl.keys import Draws, Keys
from privdl.mechanisms.base import Access, BatchGradient, ClippedSum, GradientMechanism
from privdl.placement import Placement
from privdl.tasks.base import Task

#: numbers per parameter block processed at once by the generic per-example path (m · chunk · d ≤ this)
CHUNK_BUDGET = 2**22


class GradientOracle:
    """Privatised gradients for the algorithm: ``oracle(models, owners=None, tag=...)`` → (m, d)."""

    def __init__(self, task: Task, mechanism: GradientMechanism, keys: Keys, *, gradient: str = "auto",
                 placement: Placement | None = None, agree: Callable[[int], int] | None = None) -> None:
        self.task, self.mechanism, self.keys = task, mechanism, keys
        # a slice (privdl.placement): reads only its agents' data; ``agree`` gives the slices' largest lot length
        self.placement = None if placement is None or placement.complete else placement
        if self.placement is not None and agree is None:
            raise ValidationError("a gradient oracle that holds only some agents needs agree= (the slices' "
                                  "largest lot length)")
        self.agree = agree
        self.calls = 0
        #: ``on_access(t, access, batch)`` sees every access's examples (round t, set by the engine): the engine's
        #: own record of what was drawn, for attacks and audits that need the true samples
        self.on_access: Callable | None = None
        self.t = 0
        self._batch = None
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
            if self.placement is not None:
                batch = self._held("sample", owners, requesters, rows)[0]
            else:
                batch = self.task.sample(self._draws("batch", owners, requesters), self._agents(owners))
            self._batch = batch
            value = self._batch_grad(models, batch)
        elif isinstance(need, ClippedSum):
            value = self.clipped_sum(models, owners, requesters, need)
        else:  # pragma: no cover - the Need union is closed
            raise ValidationError(f"unknown need {need!r}")
        if self.on_access is not None:
            self.on_access(self.t, access, self._batch)
        return self.mechanism.privatize(value, access) if protect else self.mechanism.unprotected(value, access)

    def _draws(self, purpose: str, owners: torch.Tensor, requesters: torch.Tensor) -> Draws:
        if self._everyone:  # every row for itself: the keys' deduplicated fast path
            return Draws(self.keys, purpose, self.calls)
        return Draws(self.keys, purpose, self.calls, owners.numpy(), requesters.numpy())

    def _held(self, kind: str, owners: torch.Tensor, requesters: torch.Tensor, rows: int,
              need: ClippedSum | None = None) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        """A slice's batch: the task samples only the rows whose data owner it holds (from their own keys); the
        other rows get zeros (and a zero mask), so the batch has the whole network's shape — lots padded to the
        length the slices agree on, as the simulator pads them — and each held row the simulator's values."""
        held = torch.from_numpy(self.placement.rows_held)[owners % self.placement.rows]
        idx = held.nonzero().reshape(-1)
        o, r = owners[idx], requesters[idx]
        if kind == "lot":
            rates = need.rates.reshape(-1)
            agree = self.agree
            if not o.numel():  # no owner of this access here: still take part in the agreement
                return self._zeros(rows, agree(1), mask=True)
            part, mask = self.task.sample_lot(Draws(self.keys, "lot", self.calls, o.numpy(), r.numpy()),
                                              self._agents(o), rates.index_select(0, o % rates.numel()),
                                              length=agree)
        elif not o.numel():
            return self._zeros(rows, need.batch if kind == "subset" else self.task.batch_size,
                               mask=kind == "subset")
        elif kind == "subset":
            part, mask = self.task.sample_subset(Draws(self.keys, "batch", self.calls, o.numpy(), r.numpy()),
                                                 self._agents(o), need.batch)
        else:
            part, mask = self.task.sample(Draws(self.keys, "batch", self.calls, o.numpy(), r.numpy()),
                                          self._agents(o)), None
        where = idx.to(part[0].device)
        batch = tuple(torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device).index_copy_(0, where, t)
                      for t in part)
        if mask is not None:
            mask = torch.zeros((rows, mask.shape[1]), dtype=self.task.dtype, device=mask.device).index_copy_(
                0, where, mask.to(self.task.dtype))
        return batch, mask

    def _zeros(self, rows: int, width: int, *, mask: bool) -> tuple[tuple[torch.Tensor, ...], torch.Tensor | None]:
        """A batch of the task's shapes, all zeros (and a zero mask): an access none of whose owners this slice
        holds (a held agent's data gives the shapes)."""
        agent = torch.as_tensor([self.placement.agents[0]])
        part = self.task.gather(agent, torch.zeros((1, width), dtype=torch.int64))
        batch = tuple(torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device) for t in part)
        return batch, (torch.zeros((rows, width), dtype=self.task.dtype, device=part[0].device) if mask else None)

    def clipped_sum(self, models: torch.Tensor, owners: torch.Tensor, requesters: torch.Tensor,
                    need: ClippedSum) -> torch.Tensor:
        if self.placement is not None:
            batch, mask = self._held("subset" if need.batch is not None else "lot", owners, requesters,
                                     models.shape[0], need)
        elif need.batch is not None:  # a uniform batch of distinct examples, from the mini-batch key
            batch, mask = self.task.sample_subset(self._draws("batch", owners, requesters), self._agents(owners),
                                                  need.batch)
        else:
            rates = need.rates.reshape(-1)
            row_rates = rates.index_select(0, owners % rates.numel())
            batch, mask = self.task.sample_lot(self._draws("lot", owners, requesters), self._agents(owners),
                                               row_rates)
        self._batch = (batch, mask)
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
