"""privdl: privacy-preserving decentralized learning.

The agent axis: every per-agent quantity is a tensor whose leading axis is the agent. See README.md.
"""

__version__ = "0.1.0"
