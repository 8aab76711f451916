"""The public face (issue 45): ``privdl.Network`` from a graph, edges or W; ``privdl.task_from_arrays`` (and its bad
input); ``privdl.train`` — the runner's one pipeline, so a run given as tables is the CLI's run (same id, ledger,
metrics) — and its ``Result``, whose saved manifest ``privdl account --manifest`` re-accounts."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import privdl
from privdl.cli import app
from privdl.errors import ConfigError, ValidationError
from tests.conftest import run_toml


def blobs(m: int = 120, features: int = 4, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Separable Gaussian blobs: ``m`` examples, labels 0..classes−1."""
    rng = np.random.default_rng(seed)
    y = np.arange(m) % classes
    centres = rng.normal(scale=3.0, size=(classes, features))
    return centres[y] + rng.normal(size=(m, features)), y


def mlp(features: int = 4, outputs: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(features, 8), torch.nn.Tanh(), torch.nn.Linear(8, outputs))


# ---- networks ------------------------------------------------------------------------------------------------------

def test_a_network_from_a_graph_from_edges_and_from_its_matrix_is_one_network():
    ring = privdl.Network.from_graph(nx.cycle_graph(6))
    edges = privdl.Network.from_edges(6, [(k, (k + 1) % 6) for k in range(6)])
    arrays = privdl.Network.from_edges(6, np.arange(6), (np.arange(6) + 1) % 6)
    again = privdl.Network.from_matrix(ring.W)
    for other in (edges, arrays, again):
        np.testing.assert_array_equal(other.W, ring.W)
    assert ring.W[0, 1] == pytest.approx(1 / 3)
    with pytest.raises(ValidationError, match=r"\(i, j\) pairs"):
        privdl.Network.from_edges(6, [0, 1, 2])


# ---- task_from_arrays ----------------------------------------------------------------------------------------------

def test_arrays_become_a_task_split_by_the_partition_with_the_configs_defaults():
    X, y = blobs(200)
    task = privdl.task_from_arrays(X, y, X_test=X[:50], y_test=y[:50], model="softmax", agents=5,
                                   partition="dirichlet", alpha=0.3, seed=4)
    from privdl.data import partition

    want = partition("dirichlet", y, 5, np.random.default_rng(4), alpha=0.3)
    assert [len(p) for p in task.parts] == [len(p) for p in want] and sum(map(len, task.parts)) == 200
    assert task.model.name == "linear" and task.dim == 3 * 4 + 3 and task.batch_size == 32
    # the config's default alpha (10) when none is given, tensors as well as arrays
    default = privdl.task_from_arrays(torch.as_tensor(X), torch.as_tensor(y), X_test=X[:50], y_test=y[:50],
                                      agents=5, partition="dirichlet", seed=4)
    assert [len(p) for p in default.parts] == [len(p) for p in partition("dirichlet", y, 5, np.random.default_rng(4),
                                                                         alpha=10.0)]
    # no test set: a fifth of the examples is held out
    held = privdl.task_from_arrays(X, y, agents=5)
    assert sum(map(len, held.parts)) == 160 and len(held.y_test) == 40


def test_a_module_is_copied_checked_and_trained_as_given():
    X, y = blobs(90)
    module = mlp()
    before = [p.detach().clone() for p in module.parameters()]
    task = privdl.task_from_arrays(X, y, model=module, agents=3)
    assert task.dim == sum(p.numel() for p in module.parameters())
    task.init_params(torch.Generator().manual_seed(1))  # re-initialises the task's copy, never the caller's module
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))
    # two classes, one logit: binary cross-entropy
    Xb, yb = blobs(60, classes=2)
    binary = privdl.task_from_arrays(Xb, yb, model=mlp(outputs=1), agents=2)
    assert binary.binary and binary.model.squeeze


BAD_INPUT = {
    "mismatched lengths": (lambda X, y: dict(X=X, y=y[:-1]), r"X has 60 examples but y has 59 labels"),
    "mismatched test lengths": (lambda X, y: dict(X=X, y=y, X_test=X[:10], y_test=y[:9]),
                                r"X_test has 10 examples but y_test has 9"),
    "nan feature": (lambda X, y: dict(X=np.where(np.arange(60)[:, None] == 7, np.nan, X), y=y),
                    r"X has NaN or infinite values in 1 example\(s\), the first at index 7"),
    "inf test feature": (lambda X, y: dict(X=X, y=y, X_test=np.full((4, 4), np.inf), y_test=y[:4]),
                         r"X_test has NaN or infinite values"),
    "negative label": (lambda X, y: dict(X=X, y=np.where(np.arange(60) == 3, -1, y)),
                       r"labels must lie in 0\.\.2 \(3 classes\); y\[3\] = -1"),
    "label beyond the classes": (lambda X, y: dict(X=X, y=y, classes=2), r"labels must lie in 0\.\.1 .*y\[2\] = 2"),
    "test label beyond the training labels": (lambda X, y: dict(X=X, y=y, X_test=X[:3], y_test=[0, 1, 5],
                                                                classes=3), r"y_test\[2\] = 5"),
    "fractional label": (lambda X, y: dict(X=X, y=y + 0.5), r"integer class labels; y\[0\] = 0\.5"),
    "fewer examples than agents": (lambda X, y: dict(X=X[:6], y=y[:6], X_test=X, y_test=y, agents=7),
                                   r"6 training examples cannot be shared by 7 agents"),
    "output size": (lambda X, y: dict(X=X, y=y, model=mlp(outputs=5)),
                    r"the model gives 5 output\(s\) per example but the labels have 3 classes"),
    "logistic on three classes": (lambda X, y: dict(X=X, y=y, model="logistic"), r"needs a binary dataset"),
    "batch norm": (lambda X, y: dict(X=X, y=y, model=torch.nn.Sequential(torch.nn.Linear(4, 3),
                                                                         torch.nn.BatchNorm1d(3))),
                   r"layer '1' \(BatchNorm1d\) does not support per-example gradients \(use GroupNorm"),
    "forward fails": (lambda X, y: dict(X=X, y=y, model=torch.nn.Linear(7, 3)), r"forward pass fails"),
    "unknown model": (lambda X, y: dict(X=X, y=y, model="transformer"), r"unknown model 'transformer'; valid "
                                                                        r"names: cnn, logistic, mlp"),
    "unknown partition": (lambda X, y: dict(X=X, y=y, partition="zipf"), r"unknown partition 'zipf'; valid names"),
    "partition key": (lambda X, y: dict(X=X, y=y, partition="iid", alpha=0.5),
                      r"bad parameters for partition 'iid'.*'alpha'"),
    "one feature axis missing": (lambda X, y: dict(X=X[:, 0], y=y), r"shape \(N, features\.\.\.\)"),
    "agents": (lambda X, y: dict(X=X, y=y, agents=0), r"agents must be an integer >= 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_to_task_from_arrays_is_a_clear_validation_error(case):
    X, y = blobs(60)
    make, message = BAD_INPUT[case]
    args = {"agents": 3, **make(X, y)}
    with pytest.raises(ValidationError, match=message):
        privdl.task_from_arrays(args.pop("X"), args.pop("y"), **args)


# ---- train ---------------------------------------------------------------------------------------------------------

CONFIG = """
name = "library"
seed = 3
iterations = 40
eval_every = 20
[network]
topology = "ring"
n = 5
[task]
name = "logistic"
dataset = "breast_cancer"
batch_size = 16
[algorithm]
name = "dsgt"
[mechanism]
name = "gaussian_ldp"
epsilon = 20.0
delta = 1e-5
clip = 1.0
[schedule]
name = "constant"
eta = 0.05
"""

#: manifest keys that say when and where a run ran, not what it computed
WHEN = ("seconds", "finished_at", "started_at", "process", "iterations_per_second", "keys", "config")


def test_train_given_tables_is_the_cli_run_of_that_config(tmp_path):
    """One pipeline: ``privdl.train`` with the config's tables gives the run ``privdl run`` gives — its id, its
    metrics and final models' numbers, its ledger (the object the manifest holds) and every manifest fact."""
    cli = run_toml(tmp_path, CONFIG)
    res = privdl.train(task={"name": "logistic", "dataset": "breast_cancer", "batch_size": 16},
                       network={"topology": "ring", "n": 5}, algorithm="dsgt",
                       mechanism={"name": "gaussian_ldp", "epsilon": 20.0, "delta": 1e-5, "clip": 1.0},
                       schedule={"name": "constant", "eta": 0.05}, iterations=40, seed=3, eval_every=20)
    man = res.manifest()
    assert man["run_id"] == cli["run_id"]
    where = ("name", "base_dir")  # the experiment's name and the config file's folder: no part of the run
    assert {k: v for k, v in man["config"].items() if k not in where} == \
        {k: v for k, v in cli["config"].items() if k not in where}
    assert {k: v for k, v in man.items() if k not in WHEN} == {k: v for k, v in cli.items() if k not in WHEN}
    assert man["privacy_ledger"][0] == {**res.ledger.to_dict(), "keys": "root"}
    assert res.ledger.epsilon == pytest.approx(20.0) and len(res.ledger.per_agent()) == 5
    assert res.final == cli["final_metrics"] and res.final["test_accuracy"] > 0.8
    rows = [(r["iteration"], r["metric"], r["value"]) for r in res.metrics]
    assert {t for t, _, _ in rows} == {0, 20, 40} and (40, "test_accuracy", res.final["test_accuracy"]) in rows
    assert res.models.shape == (5, 31)
    accuracy = [float((res.task.model.predict(res.models[i].double(), res.task.X_test).gt(0).long()
                       == res.task.y_test).double().mean()) for i in range(5)]
    assert np.mean(accuracy) == pytest.approx(res.final["test_accuracy"])


def test_train_own_arrays_module_graph_with_dp_sgd_saves_a_run_the_cli_reaccounts(tmp_path):
    """DP-SGD at example level on a caller's arrays, module and graph: the ledger states it; the saved run holds the
    metrics and a manifest that ``privdl account --manifest`` re-accounts to the same ε, verified."""
    X, y = blobs(160)
    task = privdl.task_from_arrays(X, y, model=mlp(), agents=4, batch_size=8)
    graph = nx.relabel_nodes(nx.path_graph(4), {k: f"site-{k}" for k in range(4)})
    res = privdl.train(task=task, network=graph, algorithm="dsgd",
                       mechanism={"name": "dp_sgd", "noise_multiplier": 1.2, "delta": 1e-5, "clip": 1.0,
                                  "lot_size": 8},
                       schedule={"name": "constant", "eta": 0.2}, iterations=30, eval_every=10)
    assert res.ledger.unit == "example" and res.ledger.mechanism == "dp_sgd"
    rows = res.ledger.per_agent()
    assert [r["accesses"] for r in rows] == [30] * 4 and rows[0]["noise_multiplier"] == 1.2
    assert 0 < res.ledger.epsilon < float("inf")
    # an agent's model back as a module: its predictions are the task's at that row
    module = res.module(2)
    with torch.no_grad():
        want = task.model.predict(res.models[2].to(task.dtype), task.X_test)
        np.testing.assert_allclose(module(task.X_test.float()).numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    path = res.save(tmp_path / "run")
    assert path == tmp_path / "run" / "manifest.json"
    lines = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert lines[0] == "iteration,metric,value" and len(lines) == len(res.metrics) + 1
    out = CliRunner().invoke(app, ["account", "--manifest", str(path), "--format", "json"])
    assert out.exit_code == 0, out.output
    again = json.loads(out.output)
    assert again["verified"] is True and again["epsilon"] == res.ledger.epsilon
    assert [r["epsilon"] for r in again["per_agent"]] == [r["epsilon"] for r in rows]
    # the run's config names the objects it was given (their class; the graph by its W's fingerprint)
    cfg = res.manifest()["config"]
    assert cfg["task"]["object"].endswith("SupervisedTask") and cfg["network"]["W_fingerprint"] == \
        privdl.Network.from_graph(graph).fingerprint


def test_train_takes_built_objects():
    """An algorithm, a mechanism built for the run's accesses and a schedule, each an object."""
    net = privdl.Network.from_graph(nx.cycle_graph(4))
    X, y = blobs(80)
    task = privdl.task_from_arrays(X, y, agents=4)
    algorithm = privdl.ALGORITHMS.build("dsgd")
    mechanism = privdl.MECHANISMS.build("gaussian_ldp", steps=algorithm.accesses(20, net.edges), network=net,
                                        epsilon=10.0, delta=1e-5, clip=1.0)
    from privdl.schedules import make_schedule

    res = privdl.train(task=task, network=net, algorithm=algorithm, mechanism=mechanism,
                       schedule=make_schedule("constant", eta=0.1, iterations=20), iterations=20)
    assert res.ledger.epsilon == pytest.approx(10.0) and res.ledger.mechanism == "gaussian_ldp"
    assert res.manifest()["config"]["mechanism"]["name"] == "gaussian_ldp"
    assert res.ledger.guarantee in repr(res) and "agents=4" in repr(res)


@pytest.mark.parametrize("bad, message", [
    (dict(algorithm="adam_dl"), r"unknown algorithm 'adam_dl'; valid names: .*dsgd"),
    (dict(mechanism={"name": "dp_sgd", "epsilon": 3.0, "clip": 1.0, "lot_sise": 8}), r"unknown key "
                                                                                      r"'mechanism.lot_sise'"),
    (dict(schedule={"name": "constant"}), r"missing key 'schedule.eta'"),
    (dict(task=np.zeros(3)), r"task must be a registered name, a table \(dict\) or a Task, got ndarray"),
    (dict(iterations=0), r"iterations must be >= 1"),
    (dict(task=privdl.task_from_arrays(*blobs(30), agents=3)), r"split over 3 agents, the network has 4"),
])
def test_train_refuses_bad_components_by_name(bad, message):
    args = dict(task={"name": "quadratic"}, network={"topology": "ring", "n": 4}, algorithm="dsgd",
                mechanism="none", schedule={"name": "constant", "eta": 0.1}, iterations=5)
    with pytest.raises((ConfigError, ValidationError), match=message):
        privdl.train(**{**args, **bad})


def test_the_readmes_library_section_runs_as_printed(tmp_path, monkeypatch):
    """README.md's "Use it as a library" example, exactly as printed; its saved run re-accounts."""
    from tests.conftest import readme_python, run_printed

    monkeypatch.chdir(tmp_path)
    printed = run_printed(readme_python("## Use it as a library"))
    assert "(3, 1e-05)-DP per agent, example level" in printed and "test accuracy 0.9" in printed
    out = CliRunner().invoke(app, ["account", "--manifest", "runs/mine/manifest.json", "--format", "json"])
    assert out.exit_code == 0 and json.loads(out.output)["verified"] is True, out.output
