"""Experiments: config → sweep of runs → results store → plots."""

from privdl.experiment.config import RunSpec, expand, load_config
from privdl.experiment.runner import ExperimentSummary, run_experiment, run_one
from privdl.experiment.store import ResultStore, read_results


def __getattr__(name: str):
    """``plot_experiment`` loads matplotlib: imported on first use only (a runtime worker never plots)."""
    if name == "plot_experiment":
        from privdl.experiment.plot import plot_experiment

        return plot_experiment
    raise AttributeError(f"module 'privdl.experiment' has no attribute {name!r}")


__all__ = ["ExperimentSummary", "ResultStore", "RunSpec", "expand", "load_config", "plot_experiment",
           "read_results", "run_experiment", "run_one"]
