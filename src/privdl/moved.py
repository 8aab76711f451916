"""Clear errors for the library paths that the foundation change (issue 11) removed or renamed.

Importing a removed module, or reading a removed name from a package that still exists, fails with an error that
names the replacement, instead of a bare ``ModuleNotFoundError`` / ``AttributeError``.
"""

from __future__ import annotations

import importlib.abc
import sys

MOVED_MODULES = {
    "privdl.rng": "privdl.keys (every draw is keyed per agent: Keys, RootKeys, Draws)",
    "privdl.simulator.gradients": "privdl.gradients",
    "privdl.simulator.ghost": "privdl.gradients (per-layer ghost-clipping rules: register_ghost, ghost_clipped_sum)",
    "privdl.simulator.replicas": "privdl.simulator.simulate_replicas(task, algorithm, replicas=[Replica(...)])",
    "privdl.audit.copies": "privdl.comm.StackedComm(network, copies=k)",
}

MOVED_NAMES = {
    "privdl.simulator": {
        "gradient_oracle": "privdl.simulator.GradientOracle",
        "per_agent_gradients": "privdl.gradients.per_agent_gradients",
        "per_example_gradients": "privdl.gradients.per_example_gradients",
    },
    "privdl.privacy": {"LedgerEntry": "privdl.privacy.Ledger (privacy events per agent, re-accountable)"},
    "privdl.network.network": {"Neighbours": "privdl.comm.make_comm(network) (agents talk through a Comm)"},
    "privdl.tasks.models": {"FlatModel": "privdl.tasks.models.ModuleModel"},
}


for _old, _new in MOVED_MODULES.items():  # `from privdl.simulator import replicas` names the replacement too
    _parent, _, _child = _old.rpartition(".")
    MOVED_NAMES.setdefault(_parent, {})[_child] = _new


class MovedError(ImportError):
    """A removed name or module; the message names its replacement. An ImportError, not an AttributeError, so that
    ``from package import name`` shows the message instead of Python's generic "cannot import name"."""


def _message(old: str, new: str) -> str:
    return f"{old} was removed by the foundation change (issue 11); use {new}"


def moved_attribute(module: str, name: str) -> Exception:
    """The error for reading ``name`` from ``module`` (the module's ``__getattr__`` raises it)."""
    new = MOVED_NAMES.get(module, {}).get(name)
    if new is None:
        return AttributeError(f"module {module!r} has no attribute {name!r}")
    return MovedError(_message(f"{module}.{name}", new))


class _MovedModules(importlib.abc.MetaPathFinder):
    """Consulted after every real finder: only a module that does not exist any more reaches it."""

    def find_spec(self, fullname, path, target=None):
        if fullname in MOVED_MODULES:
            raise ModuleNotFoundError(_message(fullname, MOVED_MODULES[fullname]), name=fullname)
        return None


def install() -> None:
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())
