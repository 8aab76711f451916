"""``RuntimeSpec``: the ``[runtime]`` table as a typed value — exactly the keys the config validates, their
documented defaults, the same view of an experiment's raw table and of a run's validated one, and a view only (the
config dict, its run id and the manifests do not change)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from privdl.errors import ConfigError
from privdl.experiment.config import expand
from privdl.experiment.config_runtime import RUNTIME_FIXED
from privdl.runtime_spec import DEFAULT_TIMEOUT, RuntimeSpec

ROOT = Path(__file__).resolve().parents[1]

BASE = {"iterations": 2, "network": {"topology": "ring", "n": 4}, "task": {"name": "quadratic"},
        "schedule": {"eta": 0.1}}


def test_the_fields_are_the_validated_keys_with_their_defaults():
    fields = {f.name: f.default for f in dataclasses.fields(RuntimeSpec)}
    assert list(fields) == list(RUNTIME_FIXED)
    for key, (_, default) in RUNTIME_FIXED.items():
        if default is not None:
            assert fields[key] == default, key
    assert fields["timeout"] == DEFAULT_TIMEOUT == 120.0  # docs/CONFIG.md's default; the readers' before
    spec = RuntimeSpec.of({})
    assert (spec.backend, spec.keys, spec.transport, spec.identity, spec.agreed) == (
        "simulator", "root", "gloo", "none", False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.backend = "dist"


@pytest.mark.parametrize("runtime", [
    {}, {"slices": 3}, {"backend": "sliced"}, {"assignment": [[0, 3], [1, 2]], "timeout": 4},
    {"backend": "dist", "agents_per_process": 2, "transport": "gloo", "procs": 2},
    {"checkpoint_every": 5, "keys": "agreed"},
    {"keys": "agreed", "identity": "ed25519", "roster": "r.json", "identity_dir": "ids"},
])
def test_a_runs_validated_table_and_the_raw_one_give_one_spec_and_the_config_is_unchanged(runtime):
    cfg = {**BASE, "runtime": runtime}
    before = json.dumps(cfg, sort_keys=True)
    (spec,), _ = expand(cfg)
    raw, run = RuntimeSpec.of(cfg), RuntimeSpec.of(spec.config)
    assert raw == run
    assert json.dumps(cfg, sort_keys=True) == before
    for key, value in spec.config["runtime"].items():
        want = (tuple(map(tuple, value)) if key == "assignment" else float(value) if key == "timeout" else value)
        assert getattr(run, key) == want, key
    assert isinstance(run.timeout, float)
    assert run.agreed == (runtime.get("keys") == "agreed")


def test_run_ids_depend_on_agreed_keys_only():
    ids = {json.dumps(rt): expand({**BASE, "runtime": rt})[0][0].run_id
           for rt in ({}, {"slices": 2}, {"checkpoint_every": 3, "timeout": 9.5}, {"keys": "agreed"})}
    plain = expand(dict(BASE))[0][0].run_id
    assert ids[json.dumps({})] == ids[json.dumps({"slices": 2})] == plain
    assert ids[json.dumps({"checkpoint_every": 3, "timeout": 9.5})] == plain
    assert ids[json.dumps({"keys": "agreed"})] != plain


def test_an_unknown_key_is_refused_naming_it():
    with pytest.raises(ConfigError, match="runtime.slice'"):
        RuntimeSpec.of({"runtime": {"slice": 2}})


def test_every_shipped_configs_runtime_reads():
    from privdl.experiment import load_config

    for path in sorted((ROOT / "examples").glob("*.toml")):
        cfg = load_config(path, validate=False)
        assert RuntimeSpec.of(cfg).backend in ("simulator", "sliced", "dist"), path
