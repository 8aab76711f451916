"""privdl's public face: what ``import privdl`` offers (``privdl.train``, ``privdl.Network``, ...).

The top room (docs/ARCHITECTURE.md, "Rooms and their order"): it gathers names from every room below, and
``privdl/__init__.py`` loads it on the first use of one of them, so ``import privdl`` itself stays cheap (no torch)
and changes no environment variable.
"""

from privdl.algorithms import ALGORITHMS, Algorithm, StepContext
from privdl.data import DATASETS, PARTITIONERS
from privdl.errors import ConfigError, PrivdlError, UnknownNameError, ValidationError
from privdl.library.arrays import task_from_arrays
from privdl.library.training import Result, train
from privdl.mechanisms import (
    MECHANISMS, MESSAGE_MECHANISMS, CorrelatedGaussian, GradientMechanism, MechanismEnv, MessageMechanism,
)
from privdl.network import MIXING_RULES, TOPOLOGIES, Network
from privdl.privacy import ACCOUNTANTS, Ledger
from privdl.schedules import SCHEDULES, Schedule
from privdl.tasks import TASKS, Task
from privdl.tasks.supervised import MODELS

__all__ = [
    "ACCOUNTANTS", "ALGORITHMS", "DATASETS", "MECHANISMS", "MESSAGE_MECHANISMS", "MIXING_RULES", "MODELS",
    "PARTITIONERS", "SCHEDULES", "TASKS", "TOPOLOGIES",
    "Algorithm", "ConfigError", "CorrelatedGaussian", "GradientMechanism", "Ledger", "MechanismEnv",
    "MessageMechanism", "Network", "PrivdlError", "Result", "Schedule", "StepContext", "Task", "UnknownNameError",
    "ValidationError", "task_from_arrays", "train",
]
