"""Experiments: config → sweep of runs → results store → plots.

The names below are loaded from their modules on first use: ``privdl.experiment.config`` loads every registry
(torch with them), ``runner`` the simulator and ``plot`` matplotlib, while the results folder (``store``), the
summary a run reports (``outcome``) and the tables of final metrics need none of them — what ``privdl run
--procs``'s launcher uses (BENCHMARKS.md, "Start-up (issue 44)")."""

from __future__ import annotations

import importlib

#: each public name → the module of privdl.experiment that defines it
_HOMES = {"RunSpec": "config", "expand": "config", "load_config": "config", "ExperimentSummary": "outcome",
          "run_experiment": "runner", "run_one": "runner", "ResultStore": "store", "read_results": "store",
          "plot_experiment": "plot"}


def __getattr__(name: str) -> object:
    """``privdl.experiment.load_config`` and the other public names, imported from their module on first use."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'privdl.experiment' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"privdl.experiment.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = ["ExperimentSummary", "ResultStore", "RunSpec", "expand", "load_config", "plot_experiment",
           "read_results", "run_experiment", "run_one"]
