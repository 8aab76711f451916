"""Algorithms as (init, step) pairs over typed state (optax style), written once against the agent axis.

``init(x0, ctx)`` and ``step(state, ctx)`` get a :class:`StepContext`:

* ``ctx.t`` the round (0 during ``init``), ``ctx.eta`` the step size (a number, or one per row (rows, 1) when
  replicas with different step sizes are stacked);
* ``ctx.comm`` — the ONLY way rows talk (:mod:`privdl.comm`: ``mix``, ``neighbour_sum``, ``pull``/``push``,
  ``reduce``, ``average``), tagged; an algorithm may read its own incoming edges (``ctx.comm.edges``,
  ``ctx.comm.degree``), never W as a whole;
* ``ctx.gradient(models, owners=None, requesters=None, tag=...)`` — privatised gradients: each call is one noisy
  access to the owners' data (a fresh mini-batch or lot and fresh noise);
* ``ctx.keys`` — the run's keys, for algorithm randomness (keyed per agent).

State is a NamedTuple of tensors (and numbers) of fixed shape. ``accesses(T, edges)`` says how many noisy accesses a
run of T rounds makes to every data owner's data — a tensor, one entry per agent — and the privacy accounting covers
exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from privdl.comm.base import Comm
from privdl.comm.frame import frame_of
from privdl.errors import ValidationError
from privdl.keys import Keys
from privdl.network.edges import Edges
from privdl.registry import Registry


@dataclass(frozen=True)
class StepContext:
    t: int
    eta: float | torch.Tensor
    comm: Comm
    gradient: Callable[..., torch.Tensor]
    keys: Keys | None = None


#: how agents combine: ``synchronous`` (one doubly stochastic ``mix``) or ``authors`` (seed 004's code: in-place
#: neighbour averaging, :meth:`privdl.comm.Comm.average_in_place`)
GOSSIPS = ("synchronous", "authors")


def check_gossip(algorithm: str, gossip: str) -> None:
    if gossip not in GOSSIPS:
        raise ValidationError(f"{algorithm} gossip must be one of {GOSSIPS}, got {gossip!r}")


def cross_gradients(ctx: StepContext, models: torch.Tensor) -> torch.Tensor:
    """The cross-gradient exchange of DPDL and CGA: every model goes to every neighbour (``pull``, tag ``model``),
    the neighbour evaluates its own data there (one access over the edge axis, keyed by owner and requester) and sends
    the result back (``push``, tag ``cross_gradient``). Row e of the result is what dst(e) received: src(e)'s data at
    dst(e)'s model, as the mechanism protects it — one row per edge the engine's agents receive
    (:class:`privdl.comm.frame.Frame`)."""
    e, frame = ctx.comm.edges, frame_of(ctx.comm)
    pulled = ctx.comm.pull(models, tag="model")  # x_src(e) at dst(e)
    cross = ctx.gradient(pulled, owners=frame.on_received(e.dst), requesters=frame.on_received(e.src),
                         tag="cross_gradient")  # dst's data at x_src
    return ctx.comm.push(cross, tag="cross_gradient")


def per_round(rounds_factor: int = 1, extra: int = 0) -> Callable[[int, Edges], torch.Tensor]:
    """``accesses`` of an algorithm that reads every agent's data ``rounds_factor`` times a round, plus ``extra``."""
    def accesses(iterations: int, edges: Edges) -> torch.Tensor:
        return torch.full((edges.rows,), rounds_factor * iterations + extra, dtype=torch.int64)
    return accesses


#: the held-frame reason of an algorithm that does not declare one (:attr:`Algorithm.held_reason`)
HELD_UNCHECKED = ("it is not one of the algorithms checked to read only its own agents' rows and the edges they "
                  "send along or receive (comm.mix, neighbour_sum, pull, push, send, reduce; keys, self-weights and "
                  "per-edge values through privdl.comm.frame.Frame)")
#: the held-frame reason of seed 004's in-place gossip (``gossip = "authors"``)
HELD_AUTHORS = ("with gossip = \"authors\" its in-place sweep goes agent by agent over the whole network "
                "(comm.average_in_place)")


class Algorithm(NamedTuple):
    name: str
    init: Callable[[torch.Tensor, StepContext], Any]
    step: Callable[[Any, StepContext], Any]
    params: Callable[[Any], torch.Tensor]  # the agents' models (rows, d) to evaluate
    accesses: Callable[[int, Edges], torch.Tensor] = per_round()  # noisy accesses per data owner in T rounds
    #: protections the algorithm itself adds (RMS, protection vectors, Laplace perturbations of messages): one
    #: template privacy event each, merged into the run's ledger (:meth:`privdl.privacy.Ledger.with_parts`)
    privacy: tuple = ()
    #: facts the combination matrix must have: "positive_definite" (exact diffusion), checked when a run is built
    requires: tuple[str, ...] = ()
    #: the public law of what is sent (a :class:`privdl.mechanisms.protection.Protection`), for eavesdroppers that
    #: know it (Kerckhoffs' principle); None when values are sent as they are
    wire: Any = None
    #: the algorithm's resolved parameters, written in the manifest
    facts: dict = {}
    #: accesses to the data made WITHOUT the mechanism's noise (``ctx.gradient(..., protect=False)``):
    #: (counts per owner in T rounds, like ``accesses``, and the reason stated in the ledger); None: there are none
    unprotected: tuple[Callable[[int, Edges], torch.Tensor], str] | None = None
    #: False when its runs must never share a replica axis: the runner then runs it alone
    stackable: bool = True
    #: True when it also reads data at other agents' models (cross-gradients: DPDL, CGA): stacked replicas then
    #: need a mechanism that takes any access (``dp_sgd``, ``none``), never the correlated family's every-row access
    cross: bool = False
    #: the random matrix step-sizes its gradients are multiplied by (seed 002's
    #: :class:`privdl.mechanisms.rms.RandomMatrixStepSize`), None without: the one place the attacks and the
    #: theory checks read them from
    rms: Any = None
    #: how it combines what the agents send (:data:`privdl.comm.base.COMBINATIONS`): ``LINEAR_MIXING`` when the
    #: agents talk only through ``comm.mix`` and every privatised gradient reaches the models only through it, as a
    #: term of the mixed value (D-SGD adapt then combine); "other" otherwise. Mechanisms whose guarantee or utility rests on W's
    #: mixing (``needs_combination``: whisper, decor, zip_dl, muffliato) refuse an algorithm without it
    combines: str = "other"
    #: what it sends each round: message tag → kind (:data:`privdl.comm.base.MESSAGE_KINDS`); Zip-DL and Muffliato
    #: average one "model" per round, the attacks' views read messages by their kind
    transmits: dict = {}
    #: True when it is correct on a directed network (:class:`privdl.network.directed.DirectedNetwork`, a
    #: column-stochastic push-sum A: ``sgp``, ``central_sgd``); every other algorithm is refused there
    #: (:func:`check_directed`)
    directed_ok: bool = False
    #: why it cannot run in the held frame (an engine holding one row per agent it holds, whose Comm offers only
    #: ``mix``, ``neighbour_sum``, the per-edge methods on its agents' edges and ``average`` through slice 0's
    #: aggregator: :class:`privdl.comm.held.HeldComm`; an algorithm indexes its rows and edges through
    #: :func:`privdl.comm.frame.frame_of`), None when it can; refused there by this reason
    #: (:func:`privdl.simulator.sliced.check_held_frame`); an algorithm that declares nothing (a plug-in's) is refused
    #: there (:data:`HELD_UNCHECKED`)
    held_reason: str | None = HELD_UNCHECKED

    def gradient_calls(self, iterations: int) -> int:
        """The most noisy accesses any agent's data gets in ``iterations`` rounds (on a 2-agent complete graph for
        algorithms whose count depends on the degree)."""
        from privdl.network.edges import Edges as _E
        import numpy as np

        return int(self.accesses(iterations, _E.from_matrix(np.full((2, 2), 0.5))).max())


def check_combination(algorithm: Algorithm, mechanism: Any) -> None:
    """Refuse a mechanism that needs of the algorithm's combination or messages what it does not declare
    (``mechanism.needs_combination``, ``mechanism.needs_transmission``: :class:`Algorithm` ``combines`` and
    ``transmits``), with the reason."""
    name = getattr(mechanism, "name", type(mechanism).__name__)
    need = getattr(mechanism, "needs_combination", None)
    if need is not None and algorithm.combines != need:
        raise ValidationError(
            f"mechanism {name!r} needs an algorithm that combines by {need} (agents that talk only through comm.mix, "
            f"every privatised gradient reaching the models only through it, W applied linearly: "
            f"{mechanism.combination_reason}); "
            f"algorithm {algorithm.name!r} declares combines = {algorithm.combines!r}")
    sends = getattr(mechanism, "needs_transmission", None)
    if sends is not None and sorted(algorithm.transmits.values()) != sorted(sends):
        raise ValidationError(
            f"mechanism {name!r} averages what the algorithm sends once per round and covers messages of kind "
            f"{', '.join(sends)} only (one averaging of the model per step, D-SGD adapt then combine); algorithm "
            f"{algorithm.name!r} sends {dict(algorithm.transmits) or 'nothing it declares'}")


def check_directed(algorithm: Algorithm, mechanism: Any, network: Any) -> None:
    """On a directed network, refuse an algorithm without ``directed_ok`` and a mechanism whose ``directed_ok`` is
    False, naming which and why."""
    if not getattr(network, "directed", False):
        return
    if not algorithm.directed_ok:
        why = ("it assumes an undirected graph with a doubly stochastic W: on the column-stochastic push-sum A of a "
               "directed graph its mixing does not reach consensus on the average (its fixed point is biased by "
               "A's Perron vector)")
        if algorithm.cross or algorithm.name in ("pd_lms", "dinno"):
            why += ", and it exchanges values along both directions of every edge, which a directed graph lacks"
        raise ValidationError(f"algorithm {algorithm.name!r} cannot run on a directed network: {why}; use "
                              "algorithm \"sgp\" (stochastic gradient push) or \"central_sgd\"")
    if not getattr(mechanism, "directed_ok", True):
        name = getattr(mechanism, "name", type(mechanism).__name__)
        raise ValidationError(f"mechanism {name!r} cannot run on a directed network: "
                              f"{getattr(mechanism, 'directed_reason', '') or 'it assumes a symmetric W'}")


ALGORITHMS: Registry[Callable[..., Algorithm]] = Registry("algorithm")
