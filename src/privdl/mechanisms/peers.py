"""What Zip-DL's and Muffliato's mechanisms share: a Comm wrapper refusing every transmission but ``mix``, once per
round, and what they need of the algorithm (:class:`AveragesTheModel`: it declares linear mixing of one model per
step, as D-SGD does — the setting both papers prove things for).

Both mechanisms act on what is sent, so they are gradient mechanisms (clip, and for Muffliato noise) **and** a
wrapper of the run's Comm, which the engine applies once (:meth:`GradientMechanism.wrap_comm`). Their privacy notion
is pairwise network DP (a curious, non-colluding agent v that sees only what is sent to it), stated in the ledger
with its own ``notion`` next to what an eavesdropper on every link learns.
"""

from __future__ import annotations

import numpy as np
import torch

from privdl.comm.base import LINEAR_MIXING, Comm
from privdl.errors import ValidationError
from privdl.mechanisms.message import IdentityEncoding, MessageMechanism, ProtectedComm


class AveragesTheModel:
    """What Zip-DL and Muffliato need of the algorithm (its declarations, checked by
    :func:`privdl.algorithms.base.check_combination` when a run is built): linear mixing, and one message a round,
    the model after one clipped gradient step (``transmits`` = one ``"model"``) — their averaging stands in for that
    one ``comm.mix``, and their privacy accounting covers that message only (not trackers, duals, cross-gradients,
    or a second averaging per step)."""

    needs_combination = LINEAR_MIXING
    needs_transmission = ("model",)
    combination_reason = ("its averaging of what is sent stands in for the algorithm's one comm.mix per round, and "
                          "its privacy accounting covers that message, the model after one clipped gradient step")


def check_unit(mechanism: str, clipping: str) -> None:
    """Zip-DL and Muffliato state pairwise network DP for one agent's clipped update; refuse example level."""
    if clipping == "batch":
        return
    if clipping == "per_example":
        raise ValidationError(
            f"mechanism {mechanism!r} cannot state its guarantee at example level (clipping = 'per_example'): its "
            f"pairwise network DP bound is for replacing one agent's clipped update (sensitivity 2C, agent level); an "
            f"example-level statement would need the per-example clipping and subsampling inside that bound, which "
            f"is not proved here. Use clipping = 'batch' (agent level), or dp_sgd / dpdl for example-level DP")
    raise ValidationError(f"clipping must be 'batch' for {mechanism!r}, got {clipping!r}")


def symmetric_w(network, mechanism: str) -> np.ndarray:
    """The network's W (dense), refused unless symmetric (both papers' assumption)."""
    w = np.asarray(network.dense(f"the {mechanism} mechanism"), dtype=np.float64)
    if not np.allclose(w, w.T, rtol=0.0, atol=1e-12):
        raise ValidationError(f"mechanism {mechanism!r} needs a symmetric W (doubly stochastic, as both papers assume)")
    return w


class OncePerRound(ProtectedComm):
    """``inner`` with ``mix`` replaced by the mechanism's averaging (:meth:`average`), called at most once per
    round; every other transmission refused, naming the algorithm's call."""

    def __init__(self, inner: Comm, mechanism: MessageMechanism | None = None, *, owner: str) -> None:
        super().__init__(inner, mechanism or IdentityEncoding())
        self.owner = owner
        self._last_round: int | None = None

    def _refuse(self, what: str, tag: str):
        raise ValidationError(f"mechanism {self.owner!r} averages with comm.mix once per step (D-SGD); the "
                              f"algorithm called comm.{what} (tag {tag!r}), which it does not cover")

    def mix(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        t = self.inner.t
        if self._last_round == t:
            raise ValidationError(f"mechanism {self.owner!r}: a second averaging in round {t} (tag {tag!r}); it "
                                  "covers one averaging per step (D-SGD)")
        self._last_round = t
        return self.average_step(x, tag=tag)

    def average_step(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:  # pragma: no cover - subclasses
        raise NotImplementedError

    def average_in_place(self, x: torch.Tensor, *, tag: str, offset: torch.Tensor | None = None) -> torch.Tensor:
        self._refuse("average_in_place (gossip = 'authors'; use the synchronous gossip)", tag)

    def neighbour_sum(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._refuse("neighbour_sum", tag)

    def pull(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._refuse("pull", tag)

    def push(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._refuse("push", tag)

    def send(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._refuse("send", tag)

    def average(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        self._refuse("average", tag)


def refuse_sliced(comm: Comm, mechanism: str) -> None:
    """Refuse a split run's network frame (a slice with a row per agent of the network): the mechanism's averaging
    runs in one engine holding every row (the simulator) or in the held frame (one row per agent held:
    :class:`privdl.comm.held.HeldComm`), where each engine draws and sends its own agents' noise only."""
    from privdl.comm.held import HeldComm
    from privdl.comm.sliced import SliceComm

    if isinstance(comm, SliceComm) and not isinstance(comm, HeldComm):
        raise ValidationError(f"mechanism {mechanism!r} runs in a split run's held frame only (runtime.frame = "
                              f"\"held\", the dist default), not in its network frame (a slice with a row per agent "
                              f"of the network, where its averaging would draw and combine rows the slice does not "
                              f"hold)")


__all__ = ["AveragesTheModel", "OncePerRound", "check_unit", "refuse_sliced", "symmetric_w"]
