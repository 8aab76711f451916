"""The rows of an engine's tensors as the code that runs on them indexes them — an algorithm's step, a message
mechanism that draws per edge — in either frame (:mod:`privdl.placement`): the network frame (one row per agent of
the network, one per edge of ``comm.edges``) or the held frame of :class:`privdl.comm.sliced.HeldComm` (one row per
agent the engine holds, one per edge its agents receive or send along)."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from privdl.comm.base import Comm


class Frame(NamedTuple):
    """The rows of an engine's tensors as an algorithm indexes them (:mod:`privdl.placement`). In the network frame
    (every backend but the held frame) row i is agent i and per-edge tensors have one row per edge of
    ``comm.edges``: ``agents``, ``received`` and ``sent`` are None (the identity) and ``received_by`` / ``sent_from``
    are the edges' ``dst`` / ``src``. In the held frame (:class:`privdl.comm.sliced.HeldComm`) row r is agent
    ``agents[r]``, per-edge tensors have one row per edge the engine's agents receive (``received``: their ids in
    ``comm.edges``; what ``pull``, ``push``, ``send`` return and ``push``, ``reduce`` take) — ``send`` takes one per
    edge they send along (``sent``) — and ``received_by`` / ``sent_from`` are those edges' receivers' / senders'
    local rows. An algorithm written against it reads only its own rows and edges in either frame."""

    agents: torch.Tensor | None
    received: torch.Tensor | None
    sent: torch.Tensor | None
    received_by: torch.Tensor
    sent_from: torch.Tensor

    def rows(self, per_agent: torch.Tensor) -> torch.Tensor:
        """The engine's rows of a per-agent tensor of the network (self-weights, degrees): itself in the network
        frame."""
        return per_agent if self.agents is None else per_agent.index_select(0, self.agents.to(per_agent.device))

    def on_received(self, per_edge: torch.Tensor) -> torch.Tensor:
        """The received edges' entries of a per-edge tensor of the network (``comm.edges.weight``, ``.src``)."""
        return per_edge if self.received is None else per_edge.index_select(0, self.received.to(per_edge.device))

    def on_sent(self, per_edge: torch.Tensor) -> torch.Tensor:
        """The sent edges' entries of a per-edge tensor of the network."""
        return per_edge if self.sent is None else per_edge.index_select(0, self.sent.to(per_edge.device))


def frame_of(comm: Comm) -> Frame:
    """The frame of ``comm``'s tensors (:class:`Frame`), through message wrappers (``inner``)."""
    inner = comm
    while getattr(inner, "inner", None) is not None:
        inner = inner.inner
    agents = getattr(inner, "frame_agents", None)
    if agents is None:
        return Frame(None, None, None, comm.edges.dst, comm.edges.src)
    return Frame(agents, inner.edges_received, inner.edges_sent, inner.received_by, inner.sent_from)


__all__ = ["Frame", "frame_of"]
