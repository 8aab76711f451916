"""The keys an experiment config may hold and their defaults: the fixed top-level and ``[network]`` keys, the names a
fixed key must be one of, the component sections and their registries, and each component's keys (its builder's
keyword parameters, less those the runner injects).

Separate from the checks that use it (:mod:`privdl.experiment.config_resolve`) and from the run ids that read it
(:mod:`privdl.experiment.run_identity`): it is the one statement of what a config may say, which docs/CONFIG.md and
its tests (tests/test_docs.py) are checked against.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from privdl.algorithms import ALGORITHMS
from privdl.errors import ConfigError, PrivdlError
from privdl.mechanisms import MECHANISMS
from privdl.network.dynamics import DYNAMICS
from privdl.network.mixing import MIXING_RULES
from privdl.network.topology import TOPOLOGIES
from privdl.registry import OneOf, one_of
from privdl.schedules import SCHEDULES
from privdl.tasks import TASKS

TOP_LEVEL: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "name": (str, "experiment"),
    "description": (str, ""),
    "seed": (int, 0),
    "iterations": (int, 1000),
    "eval_every": (int, 0),
    "dtype": (str, "float64"),
    "gradient": (str, "auto"),
    "threads": (int, 0),
    "device": (str, "cpu"),
    "train": (bool, True),
    "batch_replicas": (int, 0),
    "eavesdropper_window": (int, None),  # None: not written (the default, 100 rounds, applies to tracking tasks)
    # the folder relative paths (network.file, task.data_dir, mechanism.file) are resolved against: set by
    # load_config to the config file's folder; not part of a run's identity
    "base_dir": (str, None),
    # modules imported before any name is checked (privdl.plugins): not part of a run's identity (the names they
    # register are), written in every run's config so that its manifest says which modules it needs
    "plugins": (list, None),
}
DEVICE = re.compile(r"cpu|auto|cuda(:\d+)?")
#: keys whose values are paths (resolved against base_dir when relative)
PATH_KEYS = ("file", "data_dir", "roster", "identity_dir")
NETWORK_FIXED: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "topology": (str, "erdos_renyi"),
    "n": (int, 10),
    "mixing": (str, "metropolis_hastings"),
    "lazy": (bool, False),
    "seed": ((int, str), 0),
    "file": (str, None),
    "file_kind": (str, "auto"),
    "sparse": ((bool, str), "auto"),
    "directed": (bool, False),  # issue 46: a directed graph with column-stochastic push-sum weights
    # time-varying graphs (privdl.network.dynamics): the law of W(t), its out-peers, a cycle's graph files
    "dynamics": (str, "static"),
    "peers": (int, None),
    "graphs": (list, None),
}
#: names a fixed key must be one of
FIXED_CHOICES: dict[str, OneOf] = {
    "dtype": one_of("float32", "float64"),
    "gradient": one_of("auto", "closed_form", "torch_func"),
    "network.mixing": OneOf(MIXING_RULES),
    "network.file_kind": one_of("auto", "edges", "adjacency", "mixing"),
    "network.seed": OneOf((), lambda v: v == "run", "an integer, or \"run\" (the graph follows the run seed)"),
    "network.sparse": OneOf((), lambda v: v == "auto", "true, false or \"auto\""),
    "network.dynamics": OneOf(DYNAMICS),
}
SECTIONS = {"task": TASKS, "algorithm": ALGORITHMS, "mechanism": MECHANISMS, "schedule": SCHEDULES}
# builder parameters filled in by the runner, never by the user
INJECTED = {"task": {"n", "dtype"}, "mechanism": {"steps", "network", "task"}, "schedule": {"iterations"}, "algorithm": set()}
DEFAULT_NAMES = {"task": "quadratic", "algorithm": "dsgd", "mechanism": "none", "schedule": "constant"}


@functools.lru_cache(maxsize=None)
def _builder_params(fn: Any, skip: frozenset[str]) -> dict[str, inspect.Parameter]:
    return _params(fn, skip)


def builder_params(fn: Any, skip: set[str]) -> dict[str, inspect.Parameter]:
    """Keyword parameters of a builder (class or function), minus those the runner injects. A class whose
    ``__init__`` passes ``**kwargs`` on to its base also accepts the base's parameters."""
    return dict(_builder_params(fn, frozenset(skip)))


def _params(fn: Any, skip: frozenset[str]) -> dict[str, inspect.Parameter]:
    """Keyword parameters of a builder (class or function), minus those the runner injects. A class whose
    ``__init__`` passes ``**kwargs`` on to its base also accepts the base's parameters."""
    targets = [c.__init__ for c in fn.__mro__ if "__init__" in vars(c)] if inspect.isclass(fn) else [fn]
    out: dict[str, inspect.Parameter] = {}
    for target in targets:
        params = inspect.signature(target, eval_str=True).parameters
        for k, p in params.items():
            if k not in skip and k != "self" and k not in out and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) \
                    and not (p.kind == p.POSITIONAL_OR_KEYWORD and k == "n"):
                out[k] = p
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            break
    return out


def _component_keys(section: str, name: str) -> dict[str, inspect.Parameter]:
    if section == "network":
        params = dict(builder_params(TOPOLOGIES.get(name), {"n", "seed"}))
        return params
    return builder_params(SECTIONS[section].get(name), INJECTED[section])


def _named_component_keys(section: str, name: Any) -> dict[str, inspect.Parameter]:
    """The keys of the component ``name`` of ``section``; an unregistered name is a ConfigError naming it with the
    valid names."""
    try:
        return _component_keys(section, name)
    except PrivdlError as exc:
        raise ConfigError(f"{section}.{'topology' if section == 'network' else 'name'}: {exc}") from None
