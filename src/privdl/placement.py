"""Placement: which global agents an engine holds (the local-row / global-agent rule).

A run has ``n`` agents, numbered 0 … n − 1 by the network. The simulator holds all of them; a *slice* of a sliced
run (and, later, a process of the distributed runtime) holds only some. Every layer keys what it keeps by the global
agent id — keys, data, ledger entries, checkpoints — never by a process or a position in a list, so the same agent
draws the same numbers and makes the same accesses wherever it is placed.

**Frame.** An engine computes on tensors in the *network frame*: row i is agent i (row r·n + i is agent i of
replica r), for every agent of the network, held or not. The rows of the agents it does not hold carry no data,
draw no real keys and are never sent; the transport fills in, before every combination, exactly the rows of the
held agents' neighbours (DESIGN.md "communication"). This keeps every kernel at the simulator's shapes, which is
why a sliced run equals the simulator bit for bit on any CPU (docs/ARCHITECTURE.md, "What is bit-exact"): a
kernel's result for one row depends on the row's values and on the tensor's shape, never on the other rows'
values — and the shapes are the simulator's. The price is compute: each slice evaluates n rows, of which it keeps
its own (BENCHMARKS.md, "Sliced backend").

**The held frame** (``runtime.frame = "held"``; the distributed runtime's default where the run allows it): an
engine's tensors have one row per agent it holds, row r being ``agents[r]`` (``held_rows[r]`` in the network
frame); only the keys, the ledger's counts and the checkpoint files stay keyed by global agent id. Memory and time
per engine then grow with its agents and their neighbours, not with n; results equal the simulator's to rounding
(m-row kernels; :class:`privdl.comm.held.HeldComm`, :func:`privdl.simulator.sliced.check_held_frame`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np
import torch

from privdl.errors import ValidationError


@dataclass(frozen=True)
class Placement:
    """The global agents ``agents`` (sorted, distinct) of a network of ``n`` that one engine holds, for ``replicas``
    stacked systems (row r·n + i is agent i of replica r)."""

    n: int
    agents: tuple[int, ...]
    replicas: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.n, (int, np.integer)) and self.n >= 1):
            raise ValidationError(f"a placement needs n >= 1 agents, got {self.n!r}")
        if isinstance(self.n, bool) or (isinstance(self.replicas, bool) or not isinstance(self.replicas, (int, np.integer))
                                        or self.replicas < 1):
            raise ValidationError(f"a placement needs n >= 1 agents and replicas >= 1, got n = {self.n!r}, "
                                  f"replicas = {self.replicas!r}")
        bad = [a for a in self.agents if isinstance(a, bool) or not isinstance(a, (int, np.integer))]
        if bad:
            raise ValidationError(f"a placement's agents are integer indices, got {bad[0]!r}")
        agents = tuple(int(a) for a in self.agents)
        if not agents:
            raise ValidationError("a placement must hold at least one agent")
        if len(set(agents)) != len(agents):
            raise ValidationError(f"a placement repeats an agent: {sorted(agents)}")
        bad = [a for a in agents if not 0 <= a < self.n]
        if bad:
            raise ValidationError(f"agent {bad[0]} is not one of the network's agents 0..{self.n - 1}")
        object.__setattr__(self, "agents", tuple(sorted(agents)))

    @classmethod
    def everyone(cls, n: int, replicas: int = 1) -> "Placement":
        return cls(n, tuple(range(n)), replicas)

    @property
    def rows(self) -> int:
        """Rows of the engine's tensors (the network frame: every agent of every replica)."""
        return self.n * self.replicas

    @property
    def complete(self) -> bool:
        return len(self.agents) == self.n

    @cached_property
    def held(self) -> np.ndarray:
        """(n,) bool: whether each global agent is held."""
        out = np.zeros(self.n, dtype=bool)
        out[list(self.agents)] = True
        return out

    @cached_property
    def rows_held(self) -> np.ndarray:
        """(rows,) bool: whether each row of the frame belongs to a held agent."""
        return np.tile(self.held, self.replicas)

    @cached_property
    def row_mask(self) -> torch.Tensor:
        return torch.from_numpy(self.rows_held.copy())

    @cached_property
    def held_rows(self) -> torch.Tensor:
        """The frame's rows of the held agents, increasing (int64)."""
        return torch.from_numpy(np.flatnonzero(self.rows_held))

    def holds(self, agent: int) -> bool:
        return bool(self.held[int(agent) % self.n])

    def describe(self) -> dict[str, object]:
        return {"n": self.n, "agents": list(self.agents), "replicas": self.replicas}


def blocks(n: int, k: int) -> list[tuple[int, ...]]:
    """``n`` agents split into ``k`` contiguous blocks whose sizes differ by at most one (the larger first)."""
    size, extra = divmod(n, k)
    out, lo = [], 0
    for b in range(k):
        hi = lo + size + (1 if b < extra else 0)
        out.append(tuple(range(lo, hi)))
        lo = hi
    return out


def partition(n: int, *, slices: int | None = None,
              assignment: Sequence[Sequence[int]] | None = None, replicas: int = 1) -> list[Placement]:
    """The placements of a run split into parts: ``slices`` contiguous blocks, or an explicit ``assignment`` (one
    list of agents per part) that must cover every agent exactly once."""
    if assignment is not None:
        parts = [list(p) for p in assignment]
        if slices is not None and slices != len(parts):
            raise ValidationError(f"runtime.slices = {slices} but runtime.assignment has {len(parts)} parts")
        seen: dict[int, int] = {}
        for k, part in enumerate(parts):
            if not part:
                raise ValidationError(f"runtime.assignment part {k} holds no agent")
            for a in part:
                if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
                    raise ValidationError(f"runtime.assignment part {k}: {a!r} is not an agent index")
                if not 0 <= int(a) < n:
                    raise ValidationError(f"runtime.assignment part {k}: agent {a} is not one of 0..{n - 1}")
                if int(a) in seen:
                    raise ValidationError(f"runtime.assignment places agent {a} twice (parts {seen[int(a)]} and {k})")
                seen[int(a)] = k
        missing = sorted(set(range(n)) - set(seen))
        if missing:
            raise ValidationError(f"runtime.assignment misses agent{'s' if len(missing) > 1 else ''} "
                                  f"{', '.join(map(str, missing[:10]))}{' …' if len(missing) > 10 else ''}")
        return [Placement(n, tuple(p), replicas) for p in parts]
    if slices is None:
        return [Placement.everyone(n, replicas)]
    if isinstance(slices, bool) or not isinstance(slices, (int, np.integer)) or not 1 <= slices <= n:
        raise ValidationError(f"runtime.slices must be an integer from 1 to the number of agents ({n}), got "
                              f"{slices!r}")
    return [Placement(n, b, replicas) for b in blocks(n, int(slices))]


__all__ = ["Placement", "blocks", "partition"]
