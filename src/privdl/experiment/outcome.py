"""What running an experiment reports: :class:`ExperimentSummary` (the runs, how many were executed here, the
results file, the time), the same for the simulator's runner and the distributed runtime's launcher. A module of
its own, with no torch behind it: ``privdl run --procs``'s launcher returns one without loading torch (BENCHMARKS.md,
"Start-up (issue 44)")."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ExperimentSummary:
    out: Path
    runs: int
    executed: int
    skipped: int
    results: Path
    seconds: float
    busy: int = 0  # runs another process was still running at the end (not executed here, not in results.csv yet)
    #: run id → metrics whose last value is nan or ±inf (the run diverged or overflowed), for runs executed here
    nonfinite: dict[str, list[str]] = field(default_factory=dict)
    #: runs other processes sharing the directory finished while this one ran (it waited for those they held)
    others: int = 0

    def line(self) -> str:
        """The line ``privdl run`` ends with (the simulator's runner and the distributed runtime alike)."""
        return (f"{self.runs} runs ({self.executed} executed, {self.skipped} already done"
                + (f", {self.others} by another process sharing the folder" if self.others else "")
                + (f", {self.busy} being run by another process: run the command again when it has finished to "
                   "collect them" if self.busy else "")
                + f") in {self.seconds:.1f} s → {self.results}")


__all__ = ["ExperimentSummary"]
