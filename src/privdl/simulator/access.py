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

import math
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
                 placement: Placement | None = None, held_rows: bool = False, frame: str = "network") -> None:
        self.task, self.mechanism, self.keys = task, mechanism, keys
        # a slice (privdl.placement): reads only its agents' data; nothing is agreed with the other slices (an
        # agent's lot is its own business: padded to the slice's longest lot, summed block by block). With
        # ``held_rows`` it computes only its agents' rows (tensors of its own shape: elementwise kernels then treat
        # a row's values in another SIMD position — a vector body or the loop's tail — whose results may differ in
        # the last bit, e.g. sigmoid: equal to the simulator's within rounding, not bit for bit); without, every
        # row of the network's frame (the rows held elsewhere on zero data): the simulator's kernels on the
        # simulator's shapes, bit for bit (the sliced backend's specification, tests/test_sliced.py)
        self.placement = None if placement is None or placement.complete else placement
        self.held_rows = bool(held_rows) or frame == "held"
        # the held frame (privdl.placement): the models have one row per held agent (row r is agent agents[r]); an
        # access without owners is every held agent on its own data, keyed by its global id
        if frame not in ("network", "held"):
            raise ValidationError(f"frame must be 'network' or 'held', got {frame!r}")
        self.local = (torch.as_tensor(placement.agents, dtype=torch.int64)
                      if frame == "held" and self.placement is not None else None)
        #: the held frame's every access (each held agent on its own data): its rows, held by construction, their
        #: ids as numpy (for the keys) and as the task's agents — the same every round: not checked or made again
        self._local_rows = (None if self.local is None else
                            (torch.arange(self.local.numel()), self.local, self.local.numpy(),
                             self.local % task.n))
        #: whether those rows are every row of the run, in order (one engine holding every agent)
        self._local_everyone = (self.local is not None and self.local.numel() == keys.rows
                                and bool((self.local == torch.arange(self.local.numel())).all()))
        self._blocks: dict[tuple, tuple[ClippedSum, int]] = {}  # (id(need), rows, d) -> (need, block): _block
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
        local = self.local is not None and owners is None and requesters is None
        if local:
            if rows != self.local.numel():
                raise ValidationError(f"models have {rows} rows, this engine holds {self.local.numel()} agents (the "
                                      "held frame: one row per held agent)")
            owners = requesters = self.local
        everyone = owners is None and requesters is None and rows == self.keys.rows
        if everyone:  # the common case: every row, its own data, its own model
            if self._all is None:
                self._all = torch.arange(rows)
            owners = requesters = self._all
        elif local:  # the held frame's common case: every held agent on its own data (rows checked at the start)
            everyone = self._local_everyone
        else:
            owners, requesters = self._check(rows, owners, requesters)
            everyone = rows == self.keys.rows and Access(owners=owners, requesters=requesters, call=0).all_rows
        self.calls += 1
        access = Access(owners=owners, requesters=requesters, call=self.calls, everyone=everyone, t=self.t)
        if protect:
            self.mechanism.count(access)
        need = self.mechanism.need
        self._everyone = everyone
        if isinstance(need, BatchGradient):
            if self.placement is not None:
                idx, batch, _ = self._held("sample", owners, requesters)
                self._batch = self._full(rows, idx, batch) if self.on_access is not None else None
                value = self._rows(models, idx, lambda x, b, _: self._batch_grad(x, b), batch, None)
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

    def _held(self, kind: str, owners: torch.Tensor, requesters: torch.Tensor, need: ClippedSum | None = None,
              block: int = 1) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, torch.Tensor | None]:
        """A slice's batch: the positions (among the access's rows) whose data owner it holds, and their batch (and
        lot mask) only — the task samples them from their own keys, each the simulator's examples. Lots are padded
        to the longest of the slice's own, rounded up to a multiple of ``block`` (the simulator pads to the
        network's longest; the padded entries have a zero mask and the sums run block by block: :meth:`_clipped`):
        no slice waits for another's lot sizes. (None, None) when it holds no owner of the access."""
        if owners is self.local and requesters is self.local:  # the held frame's own access: every row held
            idx, o, ids, agents = self._local_rows
            r, draws = o, Draws(self.keys, "lot" if kind == "lot" else "batch", self.calls, ids, ids)
        else:
            held = torch.from_numpy(self.placement.rows_held)[owners % self.placement.rows]
            idx = held.nonzero().reshape(-1)
            if not idx.numel():
                return idx, None, None
            o, r = owners[idx], requesters[idx]
            draws = Draws(self.keys, "lot" if kind == "lot" else "batch", self.calls, o.numpy(), r.numpy())
            agents = self._agents(o)
        if kind == "lot":
            rates = need.rates.reshape(-1)
            part, mask = self.task.sample_lot(draws, agents, rates.index_select(0, o % rates.numel()),
                                              block=block)
        elif kind == "subset":
            part, mask = self.task.sample_subset(draws, agents, need.batch)
        else:
            part, mask = self.task.sample(draws, agents), None
        return idx, part, None if mask is None else mask.to(self.task.dtype)

    def _rows(self, models: torch.Tensor, idx: torch.Tensor, fn, batch, mask):
        """``fn(models, batch, mask)`` for the held rows ``idx`` in the frame of ``models`` (zeros in the other rows:
        they belong to other slices) — computed on those rows alone (``held_rows``), or on the whole frame with
        zero data in the other rows (the simulator's shapes)."""
        if self.held_rows and idx.numel() == models.shape[0]:  # every row held (the held frame): no copy
            return fn(models, batch, mask)
        out = models.new_zeros(models.shape)
        if not idx.numel():
            return out
        where = idx.to(models.device)
        if self.held_rows:
            return out.index_copy_(0, where, fn(models.index_select(0, where), batch, mask))
        rows = models.shape[0]
        full = self._full(rows, idx, batch)
        frame = None if mask is None else self._full(rows, idx, (mask,))[0]
        return out.index_copy_(0, where, fn(models, full, frame).index_select(0, where))

    @staticmethod
    def _full(rows: int, idx: torch.Tensor, part: tuple[torch.Tensor, ...] | None):
        """A held batch in the access's frame (zeros in rows held elsewhere), for ``on_access`` observers."""
        if part is None:
            return None
        where = idx.to(part[0].device)
        return tuple(torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device).index_copy_(0, where, t)
                     for t in part)

    def clipped_sum(self, models: torch.Tensor, owners: torch.Tensor, requesters: torch.Tensor,
                    need: ClippedSum) -> torch.Tensor:
        block = self._block(need, tuple(models.shape))
        if self.placement is not None:
            idx, batch, mask = self._held("subset" if need.batch is not None else "lot", owners, requesters, need,
                                          block)
            if self.on_access is not None:
                full = self._full(models.shape[0], idx, batch)
                self._batch = None if full is None else (full, self._full(models.shape[0], idx, (mask,))[0])
            return self._rows(models, idx, lambda x, b, m: self._clipped(x, b, m, need, models.shape, block),
                              batch, mask)
        if need.batch is not None:  # a uniform batch of distinct examples, from the mini-batch key
            batch, mask = self.task.sample_subset(self._draws("batch", owners, requesters), self._agents(owners),
                                                  need.batch)
        else:
            rates = need.rates.reshape(-1)
            row_rates = rates.index_select(0, owners % rates.numel())
            batch, mask = self.task.sample_lot(self._draws("lot", owners, requesters), self._agents(owners),
                                               row_rates, block=block)
        self._batch = (batch, mask)
        return self._clipped(models, batch, mask.to(models.dtype), need, models.shape, block)

    @staticmethod
    def _chunk(need: ClippedSum, frame: tuple[int, int]) -> int:
        """The generic path's examples per step, memory-bounded on the frame (the whole access's rows × d)."""
        return need.chunk or max(1, CHUNK_BUDGET // max(1, frame[0] * frame[1]))

    def _block(self, need: ClippedSum, frame: tuple[int, int]) -> int:
        """The examples per block of a lot's clipped sum (:meth:`_clipped`), from public facts only — the lot
        rates, every agent's data size, the frame's shape — so the simulator and every slice split lots alike: the
        generic path's chunk, else a power of two ≥ a quarter of the largest expected lot (≥ 8). Computed once per
        need and frame (every access of a run asks again)."""
        if need.rates is None:
            return 1
        key = (id(need), *frame)
        known = self._blocks.get(key)
        if known is not None and known[0] is need:
            return known[1]
        if self.per_example == "vmap":
            block = self._chunk(need, frame)
        else:
            rates = need.rates.reshape(-1).to(torch.float64).cpu()
            counts = self.task.counts.to(torch.float64)
            expected = (float((rates * counts).max()) if rates.numel() == counts.numel() else
                        float(rates.max()) * float(counts.max()))
            block = max(8, 1 << max(0, math.ceil(math.log2(max(expected / 4, 1.0)))))
        self._blocks[key] = (need, block)
        return block

    def _clipped(self, models: torch.Tensor, batch: tuple[torch.Tensor, ...], mask: torch.Tensor,
                 need: ClippedSum, frame: tuple[int, int], block: int) -> torch.Tensor:
        """The clipped lot sums of ``models``' rows. A Poisson lot is summed block by block (``block`` examples
        each, :meth:`_block`, added in order): a row's sum is then the same bits however far its lot was padded —
        past its slice's longest lot or the network's — since a block of padding adds exact zeros. The generic
        path's examples per step follow the ``frame`` (the whole access's rows), as the simulator's do."""
        chunk = self._chunk(need, frame)
        if need.rates is None:
            return self._clipped_block(models, batch, mask, need, chunk)
        total = None
        for start in range(0, mask.shape[1], block):
            part = tuple(t[:, start:start + block] for t in batch)
            value = self._clipped_block(models, part, mask[:, start:start + block], need, chunk)
            total = value if total is None else total + value
        return total

    def _clipped_block(self, models: torch.Tensor, batch: tuple[torch.Tensor, ...], mask: torch.Tensor,
                       need: ClippedSum, chunk: int) -> torch.Tensor:
        clip = need.clip
        if self.per_example == "closed_form":
            return self.task.clipped_sum(models, batch, mask, clip)
        if self.per_example == "ghost":
            return ghost_clipped_sum(self.task, models, batch, mask, clip)
        return clipped_example_sum(self.task, models, batch, mask, clip, chunk)

__all__ = ["CHUNK_BUDGET", "GradientOracle"]
