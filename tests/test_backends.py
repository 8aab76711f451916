"""The backend registry (privdl.experiment.backends): the one list of ``runtime.backend`` names, what each backend
supports, and the runner's choice of backend through it (docs/ARCHITECTURE.md, "Backends")."""

from __future__ import annotations

import pytest

from privdl.errors import ConfigError, UnknownNameError, ValidationError
from privdl.experiment.backends import BACKENDS, Backend, backend_of
from privdl.experiment.config import expand, load_config
from privdl.experiment.run_pipeline import run_one

BASE = 'iterations = 2\n[schedule]\neta = 0.1\n[network]\ntopology = "ring"\nn = 4\n'


def _spec(tmp_path, runtime: str = ""):
    path = tmp_path / "c.toml"
    path.write_text(BASE + runtime)
    specs, _ = expand(load_config(path))
    return specs[0]


def test_the_registry_names_the_three_backends_and_what_they_support():
    assert BACKENDS.names() == ["dist", "simulator", "sliced"]
    assert all(isinstance(BACKENDS.get(name), Backend) for name in BACKENDS)
    assert [name for name in BACKENDS if BACKENDS.get(name).stacks] == ["simulator"]  # stacked replicas
    assert [name for name in BACKENDS if not BACKENDS.get(name).in_process] == ["dist"]  # processes of its own
    assert all(BACKENDS.get(name).name == name for name in BACKENDS)
    with pytest.raises(UnknownNameError, match="valid names: dist, simulator, sliced"):
        BACKENDS.get("mpi")


def test_an_unknown_backend_in_a_config_is_refused_with_the_registrys_names(tmp_path):
    with pytest.raises(ConfigError, match="runtime.backend must be one of dist, simulator, sliced, got 'mpi'"):
        _spec(tmp_path, '[runtime]\nbackend = "mpi"\n')


@pytest.mark.parametrize("runtime,name", [("", "simulator"), ("[runtime]\nslices = 2\n", "sliced"),
                                          ('[runtime]\nbackend = "dist"\n', "dist")])
def test_the_runner_picks_the_backend_the_config_names(tmp_path, runtime, name):
    assert backend_of(_spec(tmp_path, runtime).config).name == name


def test_a_dist_run_is_refused_in_the_runners_process(tmp_path):
    with pytest.raises(ValidationError, match="privdl run CONFIG"):
        run_one(_spec(tmp_path, '[runtime]\nbackend = "dist"\n'))
