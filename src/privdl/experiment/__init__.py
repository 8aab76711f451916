"""Experiments: config → sweep of runs → results store → plots."""

from privdl.experiment.config import RunSpec, expand, load_config
from privdl.experiment.plot import plot_experiment
from privdl.experiment.runner import ExperimentSummary, run_experiment, run_one
from privdl.experiment.store import ResultStore, read_results

__all__ = ["ExperimentSummary", "ResultStore", "RunSpec", "expand", "load_config", "plot_experiment",
           "read_results", "run_experiment", "run_one"]
