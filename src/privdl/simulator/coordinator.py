"""The coordinator of a run split into slices — threads of the sliced backend or processes of the distributed
runtime alike: slice 0 gathers the held rows at the recorded rounds and at the end, adds up the slices' byte counts,
records the metrics (as the simulator computes them, on the gathered models) and completes every checkpoint (the
slices write their agents' files; slice 0, once every slice has saved round t, writes the recorder's, which makes
the round complete). It talks to the other slices through one method of its transport,
``gather(part, t, tag, value, shapes)`` — every slice's tensor at slice 0, the others get None —, which the
in-process :class:`privdl.comm.transport.Transport` (a hand-over under its lock: the others do not wait) and the
runtime's :class:`privdl.runtime.transport.DistTransport` (point-to-point to process 0) both have: threads and
processes run the same code. With ``local_metrics`` (the distributed runtime) the slices evaluate their own agents
instead and slice 0 receives scalars only (:meth:`Coordinator._local_metrics`, over the transport's ``send`` /
``recv``): what it receives per recorded round does not grow with the models' dimension.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from privdl.comm import Observer
from privdl.comm.observers import add_per_tag, per_tag_of_state, totals_of
from privdl.placement import Placement
from privdl.simulator.checkpoint import Checkpoints, RunState
from privdl.simulator.engine import Recorder, stateful
from privdl.tasks.base import Task

#: tags of the coordinator's messages (control: never algorithm payloads)
RECORD, FINAL, ACCESSES, SAVED = "privdl/record", "privdl/final", "privdl/accesses", "privdl/saved"
BYTES, DRAWS = "privdl/bytes", "privdl/draws"
#: tags of the metrics evaluated where the agents live (``local_metrics``): each process's sums of its agents' terms
#: (to slice 0), its partial sum of the models with its spread (to the mean's holder), the terms of the mean (from it)
TERMS, PARTIAL, AT_MEAN = "privdl/terms", "privdl/partial", "privdl/at_mean"
#: a per-tag count's columns, in the order they travel
COUNTS = ("bytes_sent", "bytes_received", "messages")


class NetworkBytes:
    """The coordinator's byte counts: the slices' meters (each counts its agents' ends,
    :class:`privdl.comm.observers.AgentBytes`) added up — their totals at every recorded round (``bytes_sent`` /
    ``bytes_received``), their per-tag counts at checkpoints and at the end — on top of the network's per-tag counts
    at the checkpoint a resumed run started from (``base``). Its state: the counts at the last checkpoint."""

    def __init__(self) -> None:
        self.base: dict = {}
        self.now = np.zeros(2, dtype=np.int64)
        self.at_checkpoint: dict = {}

    def record(self, totals: Sequence[tuple[int, int]]) -> None:
        self.now = totals_of(self.base) + np.sum(np.asarray(totals, dtype=np.int64).reshape(-1, 2), axis=0)

    def add(self, per_tags: Sequence[dict]) -> dict:
        """The network's per-tag counts: the base and the slices' since the (re)start."""
        return add_per_tag(self.base, *per_tags)

    def metrics(self, t: int, rows: slice) -> dict[str, float]:
        return {"bytes_sent": float(self.now[0]), "bytes_received": float(self.now[1])}

    def state_dict(self) -> dict:
        return {"kind": "bytes", "rows": None, "base": self.at_checkpoint}

    def load_state_dict(self, state: dict) -> None:
        self.base = per_tag_of_state(state)
        self.now, self.at_checkpoint = totals_of(self.base), dict(self.base)


class Coordinator:
    """Slice ``part``'s end of the coordination of one run over ``transport``; ``placements``: every slice's.
    Slice 0 holds the recorder (the metrics of ``task`` and ``observers``, then the network's byte counts, in the
    simulator's order) and writes the run's part of the checkpoints; the others send. One instance per slice and run;
    every slice calls the same methods at the same points of its run. ``metrics`` False: byte counts only."""

    def __init__(self, transport, part: int, placements: Sequence[Placement], *, task: Task,
                 observers: Sequence[Observer] = (), checkpoints: Checkpoints | None = None,
                 metrics: bool = True, local_metrics: bool = False, held_frame: bool = False) -> None:
        self.transport, self.part, self.placements = transport, int(part), list(placements)
        #: the slices' models have one row per held agent (:mod:`privdl.placement`), not one per agent of the network
        self.held_frame = bool(held_frame)
        self.task, self.checkpoints, self.metrics = task, checkpoints, metrics
        #: evaluate each slice's agents where they live (:meth:`_local_metrics`) when the task splits its metrics
        self.local = (bool(local_metrics) and metrics and len(self.placements) > 1
                      and type(task).agent_terms is not Task.agent_terms)
        self.bytes = NetworkBytes()
        self.watchers = [*observers, self.bytes]  # the simulator's order: observers, then the meter
        n = self.placements[0].n
        self.recorder = Recorder(task, self.watchers, 1, n) if self.part == 0 else None

    def load(self, last: int | None) -> None:
        """Resume from the checkpoint of round ``last`` (None: a fresh start): slice 0 loads the records and the
        observers' state."""
        if last is None or self.part:
            return
        st = self.checkpoints.load_run(last, RunState(last, None, 0, torch.zeros(0)))
        self.recorder.load(st.records, st.sums, st.counts)
        for o, d in zip(stateful(self.watchers), st.observers):
            o.load_state_dict(d)

    def rows(self, tag: str, t: int, x: torch.Tensor, *, held: bool | None = None) -> torch.Tensor | None:
        """Every slice's held rows of ``x`` (rows = agents; ``held``: one row per held agent, by default the
        slices' frame) in one tensor of the network's rows at slice 0, or None (the others)."""
        held = self.held_frame if held is None else held
        mine = self.placements[self.part].held_rows
        shapes = [(int(p.held_rows.numel()), *x.shape[1:]) for p in self.placements]
        got = self.transport.gather(self.part, t, tag, x if held else x[mine.to(x.device)], shapes)
        if got is None:
            return None
        if held:
            full = x.new_zeros((self.placements[0].rows, *x.shape[1:]))
            full[mine.to(x.device)] = x
        else:
            full = x.clone()
        for p, value in zip(self.placements[1:], got[1:]):
            full[p.held_rows.to(x.device)] = value.to(x.device)
        return full

    def counts(self, tag: str, t: int, rows: list[list[int]]) -> list[list[list[int]]] | None:
        """Every slice's rows of integers at slice 0 (a list per slice), or None (the others). Every slice has the
        same number of rows (e.g. its meter's tags, in the same order everywhere)."""
        mine = torch.tensor(rows, dtype=torch.int64) if rows else torch.zeros((0, 3), dtype=torch.int64)
        got = self.transport.gather(self.part, t, tag, mine, [tuple(mine.shape)] * len(self.placements))
        return None if got is None else [rows] + [g.tolist() for g in got[1:]]

    def per_tag(self, tag: str, t: int, per_tag: dict) -> dict | None:
        """The network's per-tag byte counts since the (re)start, added up at slice 0 (the others: None)."""
        names = list(per_tag)
        got = self.counts(tag, t, [[v[k] for k in COUNTS] for v in per_tag.values()])
        if got is None:
            return None
        return self.bytes.add([{name: dict(zip(COUNTS, row)) for name, row in zip(names, part)} for part in got])

    def record(self, t: int, x: torch.Tensor, totals: tuple[int, int]) -> None:
        """A recorded round: the models (or, with ``local_metrics``, the scalars the metrics need) and the meters'
        (sent, received) totals go to slice 0, which records."""
        if self.local:
            values = self._local_metrics(t, x)
            counts = self.counts(BYTES, t, [list(totals)])
            if values is not None:
                self.bytes.record([c[0] for c in counts])
                self.recorder.add(t, [values])
            return
        full = self.rows(RECORD, t, x)
        counts = self.counts(BYTES, t, [list(totals)])
        if full is None:
            return
        self.bytes.record([c[0] for c in counts])
        if self.metrics:
            self.task.at_round(t)
            self.recorder(t, full)

    @property
    def mean_holder(self) -> int:
        """The slice that sums the models into their average: the last (not slice 0, so that what slice 0 receives
        on a recorded round does not grow with the models' dimension)."""
        return len(self.placements) - 1

    def _local_metrics(self, t: int, x: torch.Tensor) -> dict[str, float] | None:
        """Round t's task metrics with every slice evaluating its own agents (the task's split:
        :meth:`privdl.tasks.base.Task.agent_terms`). Each slice sums its agents' terms (a few float64 scalars, to
        slice 0) and sends the mean's holder (:attr:`mean_holder`) its models' sum s_p (d values) and spread
        M2_p = Σ_{i∈p} ‖x_i − s_p/n_p‖²; the holder forms x̄ = Σ_p s_p / n, the consensus distance
        (Σ_p M2_p + Σ_p n_p ‖s_p/n_p − x̄‖²) / n (Chan et al.'s pairwise update: no cancellation between two large
        sums) and the task's metrics of x̄, and sends slice 0 those scalars. Slice 0 returns the metrics; the others
        None. Equal to the simulator's within rounding (sums in another order)."""
        tr, part, holder, n = self.transport, self.part, self.mean_holder, self.placements[0].n
        p = self.placements[part]
        rows = p.held_rows.to(x.device)
        own = x if self.held_frame else x[rows]
        mine = own.to(torch.float64)
        self.task.at_round(t)
        terms = self.task.agent_terms(own, (p.held_rows % n).to(x.device))
        names = list(terms)
        sums = torch.tensor([float(terms[k].sum()) for k in names], dtype=torch.float64)
        total = mine.sum(dim=0)
        spread = float(((mine - total / max(len(rows), 1)) ** 2).sum())
        partial = torch.cat([torch.tensor([spread], dtype=torch.float64), total.cpu()])
        header = (t, PARTIAL, -1, "torch.float64", tuple(partial.shape))
        mean_names = self.task.mean_term_names()
        at_header = (t, AT_MEAN, -1, "torch.float64", (1 + len(mean_names),))
        at_mean = None
        if part != holder:
            tr.send(part, holder, header, partial)
            tr.flush(part)
        else:
            parts = [partial if k == part else tr.recv(k, part, header) for k in range(len(self.placements))]
            counts = [len(q.held_rows) for q in self.placements]
            mean = sum(q[1:] for q in parts) / n
            m2 = sum(float(q[0]) for q in parts) + sum(
                c * float(((q[1:] / c - mean) ** 2).sum()) for q, c in zip(parts, counts) if c)
            of_mean = self.task.mean_terms(mean.to(dtype=x.dtype, device=x.device))
            at_mean = torch.tensor([m2 / n] + [float(of_mean[k]) for k in mean_names], dtype=torch.float64)
            if part != 0:
                tr.send(part, 0, at_header, at_mean)
                tr.flush(part)
        if part == 0 and at_mean is None:
            at_mean = tr.recv(holder, 0, at_header)
        got = tr.gather(part, t, TERMS, sums, [tuple(sums.shape)] * len(self.placements))
        if got is None:
            return None
        means = {k: float(sum(float(g[j]) for g in got)) / n for j, k in enumerate(names)}
        values = at_mean.tolist()
        return self.task.join_metrics(means, values[0], dict(zip(mean_names, values[1:])))

    def saved(self, t: int, per_tag: dict) -> None:
        """This slice wrote its agents' files of round t (``per_tag``: its meter's counts); slice 0, once every
        slice has, writes the recorder's, completing the round."""
        counts = self.per_tag(SAVED, t, per_tag)
        if counts is None:
            return
        self.bytes.at_checkpoint = counts
        records, sums, totals = self.recorder.state()
        self.checkpoints.save_run(RunState(t, None, 0, torch.zeros(0), records, sums, totals,
                                           [o.state_dict() for o in stateful(self.watchers)]))

    def finals(self, t: int, final: torch.Tensor | None, accesses: torch.Tensor
               ) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """The end of the run: every slice's final models and access counts (per row) at slice 0, or None.
        ``final`` None: the models stay with their slices (slice 0 gets None for them; the counts only)."""
        models = None if final is None else self.rows(FINAL, t, final)
        counts = self.rows(ACCESSES, t, accesses.reshape(-1, 1), held=False)  # per global row, in every frame
        return None if counts is None else (models, counts.reshape(accesses.shape))

    @property
    def records(self) -> list[tuple[int, str, float]]:
        """The run's metrics (slice 0)."""
        return self.recorder.records[0]


__all__ = ["Coordinator", "NetworkBytes"]
