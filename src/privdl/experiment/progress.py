"""Progress of a sweep: plain lines for logs with an estimate of the time left, and the tally of finished runs
(this process's and other processes' on the same directory) that feeds the bar and the lines."""

from __future__ import annotations

import json
import time
from typing import Callable

from privdl.experiment.store import ResultStore


#: the cost of one per-example access (clipped lot sum: forward, backward, per-example norms, weighted sum) against
#: a mini-batch gradient of as many examples, for the estimates of :func:`run_cost` (measured on seed 004's CNN:
#: BENCHMARKS.md, "Example-level grids stacked")
PER_EXAMPLE_COST = 2.0


def _accesses_per_round(config: dict) -> float | None:
    """Data accesses of one round summed over the agents — the algorithm's declared accesses on the run's own graph
    (DPDL: deg(j) cross-gradients per owner, DP-DSGT: 1) — or None when they cannot be known cheaply."""
    from privdl.errors import PrivdlError

    try:
        drawn = config["network"].get("seed") == "run"  # a graph per run seed
        key = json.dumps([config.get("algorithm"), config.get("network"), config.get("base_dir"),
                          config.get("seed") if drawn else None], sort_keys=True, default=str)
    except (TypeError, ValueError):
        return None
    if key not in _ACCESSES:
        from privdl.experiment.build import build_algorithm, build_network

        try:
            edges = build_network(config["network"], config.get("seed", 0), config.get("base_dir")).edges
            _ACCESSES[key] = float(build_algorithm(config).accesses(1, edges).sum())
        except (PrivdlError, KeyError, TypeError, ValueError, OSError):
            _ACCESSES[key] = None
    return _ACCESSES[key]


_ACCESSES: dict[str, float | None] = {}


def run_cost(config: dict) -> float:
    """A run's share of a sweep's time, for estimates of what is left: its rounds × the data accesses of a round over
    all agents (DPDL's cross-gradients count; a central run over pooled data costs about a tenth of a ten-agent run),
    × :data:`PER_EXAMPLE_COST` for example-level DP-SGD. Falls back to rounds × agents when the accesses cannot be
    known (a network file that is not there yet)."""
    n = config.get("network", {}).get("n") or 1
    per_round = _accesses_per_round(config) if isinstance(config.get("network"), dict) else None
    work = per_round if per_round else float(max(1, n))
    if isinstance(config.get("mechanism"), dict) and config["mechanism"].get("name") == "dp_sgd":
        work *= PER_EXAMPLE_COST
    return float(max(1, config.get("iterations", 1))) * work


class Lines:
    """Plain progress lines for logs (no terminal): runs done of the total, elapsed time and an estimate of what is
    left (from the runs finished since this process started, by it or by others sharing the directory, each
    weighted by its :func:`run_cost`, so a sweep that starts with its cheap runs is not promised an early end), at
    most one line every ``every`` seconds and one at the end."""

    def __init__(self, name: str, costs: dict[str, float], done: set[str], say: Callable[[str], None],
                 every: float = 30.0) -> None:
        self.name, self.costs, self.say, self.every = name, costs, say, every
        self.total, self.done, self.initial = len(costs), set(done), set(done)
        #: runs under way in this process → the share of their rounds done (a stacked batch's runs advance together,
        #: so the estimate counts the rounds measured so far, not only the finished runs)
        self.partial: dict[str, float] = {}
        self.start = self.last = time.perf_counter()
        say(f"{name}: {self.total} runs, {len(done)} already done")

    def update(self, done: set[str]) -> None:
        self.done = set(done)
        for r in self.done:
            self.partial.pop(r, None)
        now = time.perf_counter()
        if now - self.last >= self.every or len(self.done) >= self.total:
            self.last = now
            self.say(self.line(now))

    def advance(self, runs: list[str], fraction: float) -> None:
        """``runs`` (one stacked batch, or one run) have done ``fraction`` of their rounds."""
        for r in runs:
            if r not in self.done:
                self.partial[r] = min(1.0, max(0.0, float(fraction)))
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            self.say(self.line(now))

    def line(self, now: float) -> str:
        spent = now - self.start
        under_way = sum(self.costs.get(r, 0.0) * f for r, f in self.partial.items() if r not in self.done)
        new = sum(self.costs.get(r, 0.0) for r in self.done - self.initial) + under_way
        rest = sum(c for r, c in self.costs.items() if r not in self.done) - under_way
        left = rest * spent / new if new > 0 else None
        eta = f", ≈ {format_duration(left)} left" if left is not None and len(self.done) < self.total else ""
        return f"{self.name}: {len(self.done)}/{self.total} runs done, {format_duration(spent)} elapsed{eta}"


class Tally:
    """Which runs of a sweep are finished in the store — this process's, noted as it saves them, and other
    processes' on the same directory (``--jobs``, a second ``privdl run``), found by looking at the store at most
    every few seconds (never more than 2 % of the time) — so the progress and its estimate cover the whole sweep."""

    def __init__(self, store: ResultStore, run_ids: list[str], done: set[str],
                 show: Callable[[set[str]], None]) -> None:
        self.store, self.run_ids, self.done, self.show = store, run_ids, set(done), show
        self.last, self.wait = time.perf_counter(), 2.0

    def add(self, run_ids: list[str]) -> None:
        self.done |= set(run_ids)
        self.show(self.done)
        self.look()

    def look(self, force: bool = False) -> None:
        """Find the finished runs in the store (at once with ``force``, else only if it is time to)."""
        now = time.perf_counter()
        if not force and now - self.last < self.wait:
            return
        done = {r for r in self.run_ids if self.store.is_done(r)}
        self.last = time.perf_counter()
        self.wait = max(2.0, 50 * (self.last - now))
        if done != self.done:
            self.done = done
            self.show(done)


def format_duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


__all__ = ["Lines", "Tally", "format_duration", "run_cost"]
