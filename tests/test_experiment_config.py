"""Experiment configs checked when they are loaded (privdl.experiment.config): the sweep's grid, unknown keys and
names (an unknown name reported before the keys a sweep sets over it), wrong types, misspelled sweep axes, a network
file against conflicting keys, and values no parameter can mean.
"""

import json

import numpy as np
import pytest

from privdl.errors import ConfigError
from privdl.experiment import expand, load_config
from tests.test_experiment import BASE_TOML, SMALL, _write

def test_sweep_expands_to_a_grid_and_runs_nonprivate_once_per_seed(tmp_path):
    runs, axes = expand(load_config(_write(tmp_path)))
    assert axes == ["mechanism.name", "mechanism.epsilon", "seed"]
    assert len(runs) == 6  # (none + 2 eps) x 2 seeds
    none = [r for r in runs if r.config["mechanism"]["name"] == "none"]
    assert all(r.sweep["mechanism.epsilon"] is None for r in none) and len(none) == 2


def test_unknown_config_key_is_named_when_the_config_is_loaded(tmp_path):
    with pytest.raises(ConfigError, match=r"task\.batchsize.*valid keys: .*batch_size"):
        load_config(_write(tmp_path, SMALL.replace("batch_size = 4", "batch_size = 4\nbatchsize = 3")))
    with pytest.raises(ConfigError, match="unknown key 'foo'"):
        load_config(_write(tmp_path, "foo = 1\n" + SMALL))
    cfg = load_config(_write(tmp_path, "foo = 1\n" + SMALL), validate=False)  # raw reading stays possible
    with pytest.raises(ConfigError, match="unknown key 'foo'"):
        expand(cfg)


def test_wrong_type_and_unknown_names_in_config(tmp_path):
    with pytest.raises(ConfigError, match="batch_size.*int"):
        expand(load_config(_write(tmp_path), ["task.batch_size='x'"]))
    with pytest.raises(ConfigError, match="valid names: .*dsgd"):
        expand(load_config(_write(tmp_path), ["algorithm.name='admm'"]))
    with pytest.raises(ConfigError, match="valid names: .*logistic"):
        expand(load_config(_write(tmp_path), ["task.name='svm'"]))


#: a config with one name made unknown and a sweep over a key of that section: (what is replaced, by what, the sweep,
#: the error). The unknown name is reported as such, with the valid names, before any sweep key is checked (issue 45:
#: it said "sweep key ... valid keys: name").
UNKNOWN_NAMES = [
    ('name = "dp_sgd"', 'name = "dp_sgdd"', '"mechanism.epsilon" = [1.0, 2.0]',
     r"mechanism\.name: unknown mechanism 'dp_sgdd'; valid names: .*dp_sgd.*whisper"),
    ('name = "dsgd"', 'name = "admm"', '"algorithm.gamma" = [0.1, 0.2]',
     r"algorithm\.name: unknown algorithm 'admm'; valid names: .*dsgd.*dsgt"),
    ('name = "constant"', 'name = "cosine"', '"schedule.eta" = [0.1, 0.2]',
     r"schedule\.name: unknown schedule 'cosine'; valid names: .*constant"),
    ('name = "logistic"', 'name = "svm"', '"task.batch_size" = [4, 8]',
     r"task\.name: unknown task 'svm'; valid names: .*logistic"),
    ('dataset = "breast_cancer"', 'dataset = "cifar1000"', '"task.batchsize" = [4, 8]',
     r"key 'task\.dataset': unknown dataset 'cifar1000'; valid names: .*breast_cancer"),
    ('topology = "ring"', 'topology = "moebius"', '"network.p" = [0.5, 0.8]',
     r"network\.topology: unknown topology 'moebius'; valid names: .*erdos_renyi.*ring"),
    ('accountant = "rdp"', 'accountant = "renyi"', '"mechanism.epsilonn" = [1.0, 2.0]',
     r"key 'mechanism\.accountant': unknown name 'renyi'; valid names: .*pld.*rdp"),
]
NAMED = """
iterations = 5
[network]
topology = "ring"
n = 4
[task]
name = "logistic"
dataset = "breast_cancer"
batch_size = 4
[algorithm]
name = "dsgd"
[mechanism]
name = "dp_sgd"
accountant = "rdp"
clip = 1.0
lot_size = 4
noise_multiplier = 1.0
[schedule]
name = "constant"
eta = 0.1
[sweep]
"""


@pytest.mark.parametrize("old,new,sweep,error", UNKNOWN_NAMES, ids=[u[1] for u in UNKNOWN_NAMES])
def test_an_unknown_name_is_reported_before_the_keys_swept_over_it(tmp_path, old, new, sweep, error):
    assert NAMED.count(old) == 1
    with pytest.raises(ConfigError, match=error) as err:
        load_config(_write(tmp_path, NAMED.replace(old, new) + sweep + "\n"))
    assert "sweep key" not in str(err.value)


@pytest.mark.parametrize("sweep,error", [
    ('"mechanism.name" = ["none", "nope"]\n"mechanism.epsilon" = [1.0, 2.0]', "unknown mechanism 'nope'"),
    ('[[sweep.privacy]]\nlabel = "x"\nmechanism = { name = "nope", epsilon = 1.0 }', "unknown mechanism 'nope'"),
    ('"task.dataset" = ["breast_cancer", "nope"]\n"task.batchsize" = [4]', "key 'task.dataset': unknown dataset 'nope'"),
])
def test_an_unknown_name_given_by_the_sweep_itself_comes_first_too(tmp_path, sweep, error):
    with pytest.raises(ConfigError, match=error) as err:
        load_config(_write(tmp_path, NAMED + sweep + "\n"))
    assert "sweep key" not in str(err.value)


@pytest.mark.parametrize("override,key,valid", [
    ('task.partition="dirichlett"', "task.partition", "dirichlet"),
    ('task.dataset="breast_cancr"', "task.dataset", "breast_cancer"),
    ('network.mixing="metropolis"', "network.mixing", "metropolis_hastings"),
    ('mechanism.accountant="tigt"', "mechanism.accountant", "tight"),
    ('algorithm.optimizer="adamw"', "algorithm.optimizer", "adam"),
    ('algorithm.optimizer={name="sdg"}', "algorithm.optimizer", "sgd"),
    ('dtype="float16"', "dtype", "float32"),
    ('schedule.name="cosine"', "schedule.name", "inv_sqrt"),
])
def test_a_misspelled_registry_name_fails_at_load_with_the_valid_names(tmp_path, override, key, valid):
    text = SMALL.replace('"mechanism.name" = ["none", "gaussian_ldp"]', '"mechanism.name" = ["gaussian_ldp"]')
    text = text.replace('name = "logistic"', 'name = "logistic"\npartition = "iid"')
    if "optimizer" in override:
        text = text.replace("[schedule]", '[algorithm]\nform = "cta"\n[schedule]')
    with pytest.raises(ConfigError, match=rf"{key.split('.')[-1]}.*{valid}"):
        load_config(_write(tmp_path, text), [override])


def test_seed_groups_and_run_seeds_are_checked_too(tmp_path):
    text = SMALL.replace('"mechanism.name" = ["none", "gaussian_ldp"]', '"mechanism.name" = ["whisper"]')
    with pytest.raises(ConfigError, match="groups:M"):
        load_config(_write(tmp_path, text), ['mechanism.seeds="grups:3"'])
    cfg = load_config(_write(tmp_path, text), ['mechanism.seeds="groups:3"', 'network.seed="run"'])
    assert expand(cfg)[0][0].config["network"]["seed"] == "run"
    with pytest.raises(ConfigError, match="network.seed"):
        load_config(_write(tmp_path, text), ['network.seed="later"'])


@pytest.mark.parametrize("axis,match", [("mechanism.epsilom", r"'mechanism.epsilom' is not a key of any \[mechanism\]"),
                                        ("network.pp", r"'network.pp' is not a key of any \[network\]"),
                                        ("mechanismm.epsilon", r"unknown section \[mechanismm\]")])
def test_a_misspelled_sweep_axis_is_an_error_not_a_collapsed_grid(tmp_path, axis, match):
    """A sweep key no component accepts used to be dropped: the grid collapsed to the base value, silently."""
    from typer.testing import CliRunner

    from privdl.cli import app
    from privdl.errors import ConfigError
    from privdl.experiment.config import expand

    cfg = {"iterations": 2, "network": {"topology": "ring", "n": 4}, "task": {"name": "quadratic"},
           "mechanism": {"name": "gaussian_ldp", "epsilon": 10.0, "clip": 1.0},
           "schedule": {"name": "constant", "eta": 0.01}, "sweep": {axis: [1.0, 30.0]}}
    with pytest.raises(ConfigError, match=match):
        expand(cfg)
    bundle = {**cfg, "sweep": {"method": [{"label": "a", "mechanism": {"epsilom": 1.0}}]}}
    with pytest.raises(ConfigError, match="epsilom"):
        expand(bundle)
    path = tmp_path / "c.toml"
    path.write_text('iterations = 2\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "quadratic"\n'
                    f'[sweep]\n"{axis}" = [1.0, 30.0]\n')
    res = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and axis in res.output and "[" in res.output  # bracketed words survive the markup


def test_a_network_file_defines_the_graph_and_conflicting_keys_are_refused(tmp_path):
    """A 4-agent W file under `topology = "ring", n = 5` used to run 4 agents while the manifest said ring, n = 5."""
    from privdl.errors import ConfigError
    from privdl.experiment.runner import run_experiment

    np.save(tmp_path / "w4.npy", np.full((4, 4), 0.25))
    base = {"iterations": 2, "eval_every": 2, "task": {"name": "quadratic"},
            "schedule": {"name": "constant", "eta": 0.01}}
    for extra in ({"topology": "ring", "n": 5}, {"n": 5}, {"seed": 3}):
        with pytest.raises(ConfigError, match="defines the graph"):
            run_experiment({**base, "network": {"file": str(tmp_path / "w4.npy"), **extra}}, tmp_path / "bad")
    res = run_experiment({**base, "network": {"file": str(tmp_path / "w4.npy")}}, tmp_path / "ok")
    man = json.loads(next((tmp_path / "ok" / "runs").glob("*/manifest.json")).read_text())
    assert res.executed == 1 and man["network"]["n"] == 4 and "topology" not in man["config"]["network"]


@pytest.mark.parametrize("prefix,match", [
    ("threads = -1\n", "threads must be >= 0"),
    ('device = "tpu"\n', "device must be"),
    ("eval_every = -5\n", "eval_every must be >= 0"),
    ('seed = "abc"\nseeds = [0, 1]\n', "either 'seed'"),  # the seed axis would silently overwrite it
])
def test_bad_top_level_values_are_refused_at_load(tmp_path, prefix, match):
    (tmp_path / "c.toml").write_text(prefix + BASE_TOML)
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path / "c.toml")


@pytest.mark.parametrize("override,match", [
    ("task.angle_deg=-inf", "give a finite number"),
    ("schedule.eta=nan", "give a finite number"),
    ("task.seed=-1", "random seed and must be >= 0"),
    ("network.topology=[1, 2]", "must be a name"),
])
def test_values_no_parameter_can_mean_are_refused_at_load(tmp_path, override, match):
    """Found by benchmarks/bad_inputs.py: these ran into a traceback or printed nan."""
    (tmp_path / "c.toml").write_text(BASE_TOML)
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path / "c.toml", [override])
