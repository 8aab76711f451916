"""Progress of a sweep: plain lines for logs with an estimate of the time left, and the tally of finished runs
(this process's and other processes' on the same directory) that feeds the bar and the lines."""

from __future__ import annotations

import time
from typing import Callable

from privdl.experiment.store import ResultStore


def run_cost(config: dict) -> float:
    """A run's share of a sweep's time, for estimates of what is left: its rounds × agents (a central run over
    pooled data costs about a tenth of a ten-agent run; a longer horizon costs more)."""
    n = config.get("network", {}).get("n") or 1
    return float(max(1, config.get("iterations", 1))) * float(max(1, n))


class Lines:
    """Plain progress lines for logs (no terminal): runs done of the total, elapsed time and an estimate of what is
    left (from the runs finished since this process started, by it or by others sharing the directory, each
    weighted by its :func:`run_cost`, so a sweep that starts with its cheap runs is not promised an early end), at
    most one line every ``every`` seconds and one at the end."""

    def __init__(self, name: str, costs: dict[str, float], done: set[str], say: Callable[[str], None],
                 every: float = 30.0) -> None:
        self.name, self.costs, self.say, self.every = name, costs, say, every
        self.total, self.done, self.initial = len(costs), set(done), set(done)
        self.start = self.last = time.perf_counter()
        say(f"{name}: {self.total} runs, {len(done)} already done")

    def update(self, done: set[str]) -> None:
        self.done = set(done)
        now = time.perf_counter()
        if now - self.last >= self.every or len(self.done) >= self.total:
            self.last = now
            self.say(self.line(now))

    def line(self, now: float) -> str:
        spent = now - self.start
        new = sum(self.costs.get(r, 0.0) for r in self.done - self.initial)
        rest = sum(c for r, c in self.costs.items() if r not in self.done)
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
