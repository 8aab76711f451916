"""privdl: privacy-preserving decentralized learning.

The agent axis: every per-agent quantity is a tensor whose leading axis is the agent. See README.md.
"""

__version__ = "0.1.0"

from privdl import moved as _moved

_moved.install()  # removed modules (privdl.rng, ...) fail with the name of their replacement


def __getattr__(name: str) -> object:
    raise _moved.moved_attribute(__name__, name)
