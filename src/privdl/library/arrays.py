"""A supervised task from a caller's own arrays: :func:`task_from_arrays`.

The arrays become a :class:`~privdl.data.datasets.Dataset`, split over the agents by a registered partition
(:data:`privdl.data.PARTITIONERS`: ``iid``, ``dirichlet``, ``a_t``, ...) into the
:class:`~privdl.tasks.supervised.SupervisedTask` the config's tasks build — the same loss, metrics, keyed batches
and per-example gradients. The model is one of the config's task models by name (:data:`MODELS`) or any
``torch.nn.Module`` whose layers keep examples independent.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch

from privdl.data.datasets import Dataset, train_test_split
from privdl.errors import ValidationError
from privdl.tasks.models import ModuleModel
from privdl.tasks.supervised import MODELS, SupervisedTask


def task_from_arrays(X: Any, y: Any, *, X_test: Any = None, y_test: Any = None,
                     model: str | dict | torch.nn.Module = "softmax", agents: int, partition: str = "iid",
                     batch_size: int = 32, classes: int | None = None, test_fraction: float = 0.2, l2: float = 0.0,
                     seed: int = 0, dtype: torch.dtype = torch.float64, name: str = "arrays",
                     **partition_params: Any) -> SupervisedTask:
    """A classification task over ``agents`` agents from your own examples.

    Args:
        X: training inputs, a numpy array or tensor of shape (N, ...) (N examples of any feature shape).
        y: training labels, N integers in 0..C−1.
        X_test, y_test: a test set for the metrics (``test_loss``, ``test_accuracy``); without one, a
            ``test_fraction`` of (X, y) is held out (seeded by ``seed``).
        model: a model name of the config's tasks (``logistic``, ``softmax``, ``mlp``, ``cnn``, ``sigmoid_cnn``,
            ``resnet9``), a table ``{"name": "mlp", "hidden": 64}`` with its keys, or a ``torch.nn.Module`` that
            maps a batch (B, ...) to (B, C) logits (or (B, 1) for two classes). A module is copied; layers that mix
            examples (BatchNorm, dropout, recurrent layers) are refused, since per-example gradients need examples
            to stay independent.
        agents: how many agents share the training set (every agent gets at least one example).
        partition: a registered partition (``iid``, ``dirichlet``, ``a_t``, ``missing_classes``, ``explicit``);
            its keys go in ``partition_params`` with the config's defaults (``alpha=10.0``, ``min_size=1``,
            ``t=0.5``).
        batch_size: examples per mini-batch (mechanisms that draw Poisson lots use their own lot size).
        classes: the number of classes C (default: the largest label + 1).
        test_fraction: the share of (X, y) held out when no test set is given.
        l2: an L2 penalty (l2/2)‖θ‖² on every parameter.
        seed: the seed of the partition, the held-out split and the training-loss subset.
        dtype: the dtype the task computes in.
        name: the task's name in manifests.

    Returns:
        A :class:`~privdl.tasks.supervised.SupervisedTask` for :func:`privdl.train`.

    Raises:
        ValidationError: mismatched lengths, NaN or infinite inputs, labels outside 0..C−1, fewer examples than
            agents, a model whose output size does not match the classes, or a model layer per-example gradients
            cannot handle.
    """
    if isinstance(agents, bool) or not isinstance(agents, (int, np.integer)) or agents < 1:
        raise ValidationError(f"agents must be an integer >= 1, got {agents!r}")
    X, y = _inputs(X, "X"), _labels(y, "y")
    _same_length(X, y, "X", "y")
    if (X_test is None) != (y_test is None):
        raise ValidationError("give both X_test and y_test, or neither (then a test_fraction of X is held out)")
    if X_test is not None:
        X_test, y_test = _inputs(X_test, "X_test"), _labels(y_test, "y_test")
        _same_length(X_test, y_test, "X_test", "y_test")
        if X_test.shape[1:] != X.shape[1:]:
            raise ValidationError(f"X_test has examples of shape {X_test.shape[1:]}, X of shape {X.shape[1:]}")
    c = _classes(classes, y, y_test)
    if X_test is None:
        if not 0.0 < test_fraction < 1.0:
            raise ValidationError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
        X, y, X_test, y_test = train_test_split(X, y, test_fraction, seed)
    if len(y) < agents:
        raise ValidationError(f"{len(y)} training examples cannot be shared by {agents} agents (each needs at "
                              "least one): give more examples or fewer agents")
    ds = Dataset(name, X, y, X_test, y_test, c, source="arrays given to privdl.task_from_arrays")
    built = _model(model, ds)
    return SupervisedTask(name, ds, built, int(agents), partition_name=partition, partition_params=partition_params,
                          batch_size=batch_size, l2=l2, zero_init=built.name == "linear",
                          rng=np.random.default_rng(seed), dtype=dtype)


def _array(a: Any, what: str) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    try:
        return np.asarray(a)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{what} is not an array ({exc})") from None


def _inputs(a: Any, what: str) -> np.ndarray:
    """Inputs as float32 (N, ...): numbers, at least one feature, all finite."""
    arr = _array(a, what)
    if arr.ndim < 2 or arr.shape[0] == 0 or 0 in arr.shape[1:]:
        raise ValidationError(f"{what} must hold examples along its first axis, shape (N, features...) with N >= 1, "
                              f"got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool) or np.iscomplexobj(arr):
        raise ValidationError(f"{what} must hold real numbers, got dtype {arr.dtype}")
    bad = ~np.isfinite(arr.reshape(len(arr), -1).astype(np.float64)).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad)
        raise ValidationError(f"{what} has NaN or infinite values in {len(rows)} example(s), the first at index "
                              f"{int(rows[0])}: remove or impute them")
    return arr.astype(np.float32)


def _labels(a: Any, what: str) -> np.ndarray:
    """Labels as int64 (N,): whole numbers."""
    arr = _array(a, what)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValidationError(f"{what} must be one label per example, shape (N,), got shape {arr.shape}")
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise ValidationError(f"{what} must hold integer class labels, got dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.integer):
        whole = np.isfinite(arr) & (arr == np.round(arr))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise ValidationError(f"{what} must hold integer class labels; {what}[{i}] = {arr[i].item()!r}")
    return arr.astype(np.int64)


def _same_length(X: np.ndarray, y: np.ndarray, x_name: str, y_name: str) -> None:
    if len(X) != len(y):
        raise ValidationError(f"{x_name} has {len(X)} examples but {y_name} has {len(y)} labels")


def _classes(classes: int | None, *labels: np.ndarray | None) -> int:
    """The number of classes C (given, or the largest label + 1); every label must lie in 0..C−1."""
    given = [a for a in labels if a is not None]
    if classes is None:
        c = int(max(int(a.max()) for a in given)) + 1
    elif isinstance(classes, bool) or not isinstance(classes, (int, np.integer)):
        raise ValidationError(f"classes must be an integer >= 2, got {classes!r}")
    else:
        c = int(classes)
    if c < 2:
        raise ValidationError(f"a classification task needs at least 2 classes; the labels give {c}")
    for a, what in zip(labels, ("y", "y_test")):
        if a is None:
            continue
        bad = (a < 0) | (a >= c)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValidationError(f"labels must lie in 0..{c - 1} ({c} classes); {what}[{i}] = {int(a[i])}")
    return c


def _model(model: Any, ds: Dataset) -> ModuleModel:
    """The task's model: a config task model by name or table, or the caller's module (its output size checked)."""
    if isinstance(model, str):
        return MODELS.build(model, ds)
    if isinstance(model, dict):
        params = dict(model)
        if not isinstance(params.get("name"), str):
            raise ValidationError(f"a model table needs a name (one of {', '.join(MODELS.names())}), got {model!r}")
        return MODELS.build(params.pop("name"), ds, **params)
    if not isinstance(model, torch.nn.Module):
        raise ValidationError(f"model must be a name ({', '.join(MODELS.names())}), a table with a name, or a "
                              f"torch.nn.Module, got {type(model).__name__}")
    module = copy.deepcopy(model)  # its layers are re-initialised from the run's keys: the caller's stays as it was
    built = ModuleModel(type(model).__name__, module, ds.feature_shape)  # refuses layers that mix examples
    outputs = _outputs(module, ds)
    if outputs != ds.n_classes and not (outputs == 1 and ds.n_classes == 2):
        raise ValidationError(f"the model gives {outputs} output(s) per example but the labels have {ds.n_classes} "
                              f"classes: its last layer needs {ds.n_classes} outputs"
                              + (" (or 1: a binary logit)" if ds.n_classes == 2 else ""))
    if not built.dim:
        raise ValidationError("the model has no trainable parameters")
    built.squeeze = outputs == 1
    return built


def _outputs(module: torch.nn.Module, ds: Dataset) -> int:
    """Outputs per example of ``module`` on two training examples (its forward pass, checked)."""
    param = next(module.parameters(), None)
    x = torch.as_tensor(ds.X_train[:2], dtype=param.dtype if param is not None else torch.float32)
    try:
        with torch.no_grad():
            out = module(x)
    except Exception as exc:  # noqa: BLE001 - any failure of the caller's forward pass is reported as such
        raise ValidationError(f"the model's forward pass fails on a batch of shape {tuple(x.shape)} "
                              f"({type(exc).__name__}: {exc})") from None
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[0] != len(x):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValidationError(f"the model must map a batch of shape {tuple(x.shape)} to logits of shape "
                              f"({len(x)}, classes), got {shape}")
    return int(out.shape[1])
