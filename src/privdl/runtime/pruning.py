"""Checkpoint pruning during a distributed run, on every process, without a message.

Process 0 completes each checkpointed round (the recorder's file) and prunes the round folders it sees; on a host
whose ``--out`` it does not see, a process's agents' files used to stay until the run was saved. A process learns
without any message how far behind the others may be: rounds are synchronous, and a message of round t from a
neighbouring process means that process finished round t − 1 — its checkpoint of that round written, and at
process 0 the recorder's file that completes it —, so a process h hops away (along the network's edges, between
processes) has finished round t − h. At the end of round t a process therefore knows that every round up to
t − lag is complete everywhere, ``lag`` the most hops from any process to it (:func:`lag`), and removes its own
agents' files of the rounds older than the newest ``keep`` of those (:func:`prune_before`) — never a round that
could be the last complete one when a run stops. The rule needs a message from every neighbouring process in
every round (what the built-in algorithms send) and one graph for the whole run: a time-varying graph, or a
process no path reaches, prunes at the end only.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np


def lag(src: np.ndarray, dst: np.ndarray, owner: np.ndarray, rank: int, processes: int) -> int | None:
    """The most hops, over the processes the edges ``src[e] → dst[e]`` (agents, held per ``owner``) join, from any
    process to ``rank`` (a breadth-first search along the reversed edges); None where some process reaches it by
    no path."""
    so, do = owner[np.asarray(src, dtype=np.int64)], owner[np.asarray(dst, dtype=np.int64)]
    into: dict[int, set[int]] = {q: set() for q in range(processes)}
    for a, b in zip(so.tolist(), do.tolist()):
        if a != b:
            into[b].add(a)
    hops = {rank: 0}
    queue = deque([rank])
    while queue:
        q = queue.popleft()
        for p in into[q]:
            if p not in hops:
                hops[p] = hops[q] + 1
                queue.append(p)
    return max(hops.values()) if len(hops) == processes else None


def prune_before(rounds: Iterable[int], t: int, behind: int, keep: int) -> int | None:
    """At the end of round ``t``, with the others at most ``behind`` rounds behind: the round before which this
    process's files of ``rounds`` can go — the oldest of the newest ``keep`` rounds known complete everywhere (one
    round of margin: at most t − behind − 1) —, or None while fewer than ``keep + 1`` rounds are known complete."""
    known = sorted(r for r in rounds if r <= t - behind - 1)
    if len(known) <= keep:
        return None
    return known[-keep]


__all__ = ["lag", "prune_before"]
