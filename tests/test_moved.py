"""Nothing lost (issue 11, item 8): library paths the foundation change removed fail with the name of their
replacement, and every replacement they name exists."""

from __future__ import annotations

import importlib

import pytest

from privdl.moved import MOVED_MODULES, MOVED_NAMES, MovedError


@pytest.mark.parametrize("statement, replacement", [
    ("import privdl.rng", "privdl.keys"),
    ("from privdl import rng", "privdl.keys"),
    ("from privdl.simulator.replicas import simulate_replicas", "privdl.simulator.simulate_replicas"),
    ("from privdl.simulator import per_agent_gradients", "privdl.gradients.per_agent_gradients"),
    ("from privdl.privacy import LedgerEntry", "privdl.privacy.Ledger"),
    ("from privdl.tasks.models import FlatModel", "privdl.tasks.models.ModuleModel"),
    ("import privdl.audit.copies", "privdl.comm.StackedComm"),
])
def test_removed_paths_name_their_replacement(statement, replacement):
    with pytest.raises(ImportError) as err:
        exec(statement, {})  # failed imports are never cached, so every run goes through the import machinery
    assert "removed by the foundation change" in str(err.value) and replacement in str(err.value), err.value


def test_every_named_replacement_exists_and_unknown_names_stay_plain_errors():
    for new in list(MOVED_MODULES.values()) + [v for names in MOVED_NAMES.values() for v in names.values()]:
        path = new.split(" ")[0].split("(")[0]
        module, _, attr = path.rpartition(".")
        try:
            assert hasattr(importlib.import_module(path), "__name__")
        except ModuleNotFoundError:
            assert hasattr(importlib.import_module(module), attr), path
    import privdl.simulator

    assert not hasattr(privdl.simulator, "no_such_name")
    with pytest.raises(ModuleNotFoundError) as err:
        importlib.import_module("privdl.no_such_module")
    assert not isinstance(err.value, MovedError)
    with pytest.raises(MovedError):
        privdl.simulator.gradient_oracle  # noqa: B018
