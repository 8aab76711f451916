"""Message-side mechanisms: they act on what an agent SENDS, not on what it computes (DESIGN.md).

A :class:`MessageMechanism` encodes each transmitted value and returns the sender's own correction: with
``sent, correction = encode(x)``, the wire carries ``sent`` and, after combining, the sender adds ``correction``
to its own result (DSG-RMS removes its own protection vector this way: correction = x − sent). It wraps a Comm —
``ProtectedComm(comm, mechanism)`` — so no algorithm changes, and wrappers stack: the innermost comm is the wire,
so an observer attached to it sees every encoding, in the order the wrappers were applied.

Only the identity encoding lives here (the neutral element; ``identity`` equals no mechanism bit for bit). Protection
vectors, PD-LMS and PSGT perturbations are the seed 002 issue's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from privdl.comm.base import Comm, Observer
from privdl.errors import ValidationError
from privdl.privacy.events import ObfuscationEvent, PrivacyEvent
from privdl.registry import Registry


class MessageMechanism(ABC):
    """Encodes what a row sends. ``events()`` are this mechanism's privacy events per sender (default: none)."""

    name: str = "message"
    #: Whether ``encode(x)`` is a translation that its sender removes again: ``(x + v, −v)`` with v independent of x
    #: (fixed for the call), or ``(x, None)``. Only such an encoding can be applied exactly to the values computed
    #: during a Gauss–Seidel sweep (:meth:`ProtectedComm.average_in_place`); declare it only when it holds.
    translation: bool = False

    def bind(self, comm: Comm) -> None:
        """Called when wrapped around ``comm`` (keys for keyed encodings come through the engine's context)."""

    @abstractmethod
    def encode(self, x: torch.Tensor, *, tag: str, t: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(what is sent, the sender's correction added to its own combination; None for none)."""

    def events(self, rows: int) -> list[list[PrivacyEvent]]:
        return [[] for _ in range(rows)]


class IdentityEncoding(MessageMechanism):
    """Sends x unchanged, no correction (the neutral element)."""

    name = "identity"
    translation = True

    def encode(self, x: torch.Tensor, *, tag: str, t: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return x, None


class Obfuscating(MessageMechanism, ABC):
    """A message mechanism that hides values without a DP claim (protection vectors): its events say so."""

    reason = "protection of transmitted values without a differential-privacy guarantee"

    def events(self, rows: int) -> list[list[PrivacyEvent]]:
        return [[ObfuscationEvent(self.name, self.reason)] for _ in range(rows)]


class ProtectedComm(Comm):
    """``inner`` with every broadcast value encoded by ``mechanism``; ``mix`` and ``average_in_place`` add the
    sender's correction."""

    def __init__(self, inner: Comm, mechanism: MessageMechanism) -> None:
        super().__init__(inner.edges, groups=inner.groups)
        self.inner, self.mechanism = inner, mechanism
        mechanism.bind(inner)

    # the wire (and its observers) is the innermost comm; the round is kept in step with it
    @property
    def t(self) -> int:  # type: ignore[override]
        return self.inner.t

    @t.setter
    def t(self, value: int) -> None:
        if hasattr(self, "inner"):
            self.inner.t = value

    def attach(self, observer: Observer) -> Observer:
        return self.inner.attach(observer)

    def silenced(self):
        return self.inner.silenced()

    def detach(self, observer: Observer) -> None:
        self.inner.detach(observer)

    @property
    def observed(self) -> bool:
        return self.inner.observed

    def to(self, device: torch.device | str) -> "ProtectedComm":
        self.inner.to(device)
        self.edges = self.inner.edges
        return self

    def _encode(self, x: torch.Tensor, tag: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.mechanism.encode(x, tag=tag, t=self.inner.t)

    def mix(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        sent, correction = self._encode(x, tag)
        out = self.inner.mix(sent, tag=tag)
        return out if correction is None else out + correction

    def average_in_place(self, x: torch.Tensor, *, tag: str, offset: torch.Tensor | None = None) -> torch.Tensor:
        """The seed-004 authors' sweep (:meth:`Comm.average_in_place`) with every value sent encoded, for an encoding
        that is a translation its sender removes again (:attr:`MessageMechanism.translation`: the identity, a fixed
        protection vector); any other encoding is refused with a :class:`ValidationError`.

        The sweep runs in the inner comm (the wire: its observers see every value read; a replay or a transport
        serves it), so this wrapper can only encode the sweep's input and correct its output, as ``mix`` does:
        ``inner.average_in_place(sent, offset) + correction`` with ``sent, correction = encode(x)``. At agent k's
        turn a neighbour j that has not updated yet sends sent_j = x_j + v_j. One that has updated sends what the
        inner sweep holds for it, s_j = (average of its own and received encoded values) + offset_j, and its value
        after its correction is x'_j = s_j − v_j, so s_j is x'_j encoded (x'_j + v_j, up to the rounding of removing
        and adding v_j): every value read is encoded, and each agent removes its own v. This cannot be exact for
        any other encoding (a scaling, one without its sender's correction, one that depends on the value): the
        values agents compute during the sweep would reach the later agents unencoded, since they are computed
        inside the inner comm, where this wrapper cannot encode them. That is refused, not run unencoded."""
        if not self.mechanism.translation:
            raise ValidationError(
                f"message mechanism {self.mechanism.name!r} cannot encode the in-place (Gauss–Seidel) gossip "
                f"(gossip = 'authors', Comm.average_in_place, tag {tag!r}): agents read their neighbours' values "
                f"updated during the sweep, which the inner comm computes, so only an encoding that is a translation "
                f"its sender removes again (MessageMechanism.translation: the identity, a fixed protection vector) "
                f"reaches them encoded; use the synchronous gossip (mix) with this mechanism")
        sent, correction = self._encode(x, tag)
        out = self.inner.average_in_place(sent, tag=tag, offset=offset)
        return out if correction is None else out + correction

    def neighbour_sum(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self.inner.neighbour_sum(self._encode(x, tag)[0], tag=tag)

    def pull(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self.inner.pull(self._encode(x, tag)[0], tag=tag)

    def push(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self.inner.push(per_edge, tag=tag)

    def send(self, per_edge: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self.inner.send(per_edge, tag=tag)

    def average(self, x: torch.Tensor, *, tag: str) -> torch.Tensor:
        return self.inner.average(self._encode(x, tag)[0], tag=tag)

    def reduce(self, per_edge: torch.Tensor, *, weight: torch.Tensor | str | None = None) -> torch.Tensor:
        return self.inner.reduce(per_edge, weight=weight)

    def _mix(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - mix is overridden
        raise NotImplementedError


MESSAGE_MECHANISMS: Registry = Registry("message mechanism")
MESSAGE_MECHANISMS.add("identity", IdentityEncoding)


def protect(comm: Comm, *mechanisms: MessageMechanism) -> Comm:
    """Wrap ``comm`` with message mechanisms, first listed = applied first to what is sent (innermost is last)."""
    for m in reversed(mechanisms):
        comm = ProtectedComm(comm, m)
    return comm


__all__ = ["IdentityEncoding", "MESSAGE_MECHANISMS", "MessageMechanism", "Obfuscating", "ProtectedComm", "protect"]
