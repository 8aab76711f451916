"""Communication: the only way rows (agents) talk — tagged, observable, per-edge capable (DESIGN.md).

``make_comm(network)`` gives the simulator's Comm; :class:`StackedComm` runs replicas or copies side by side;
observers (:class:`Transcript`, :class:`ByteCounter`, any object with ``on_message``) watch the wire.
"""

from privdl.comm.backends import DenseComm, SparseComm, StackedComm, make_comm
from privdl.comm.base import SERVER, Comm, Observer, canonical_mix, canonical_neighbour_sum
from privdl.comm.observers import ByteCounter, Message, ReplayComm, Transcript

__all__ = ["SERVER", "ByteCounter", "Comm", "DenseComm", "Message", "Observer", "ReplayComm", "SparseComm",
           "StackedComm", "Transcript", "canonical_mix", "canonical_neighbour_sum", "make_comm"]
