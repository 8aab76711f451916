"""Experiment configs: TOML → validated, resolved run specifications (one per point of the sweep grid).

Layout (every key is documented in docs/CONFIG.md)::

    name = "quickstart"          # free text
    plugins = ["my_module"]      # modules imported before any name is checked (privdl.plugins)
    seeds = [0, 1, 2]            # run seeds (a sweep axis named "seed")
    iterations = 1000
    eval_every = 50
    [network]   topology/n/mixing/lazy/seed/file/file_kind + the topology's parameters (p, degree, ...)
    [task]      name + the task's parameters
    [algorithm] name + the algorithm's parameters
    [mechanism] name + the mechanism's parameters
    [schedule]  name + the schedule's parameters
    [sweep]     "section.key" = [values...]  or  [[sweep.AXIS]] tables (each with a label) of overrides

Keys valid for a component are its builder's keyword parameters. A key no component of the experiment accepts is an
error naming the key; a key that only some swept components accept is dropped for the others (so the non-private
run of an ε sweep is run once). Every name a key refers to (topology, mixing rule, task, dataset, partition,
algorithm, optimizer, mechanism, accountant, schedule, ...) is checked when the config is loaded, with the valid
names in the error — before the sweep's keys, so an unknown name whose keys a sweep sets is reported as unknown.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import itertools
import json
import math
import re
import sys
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privdl.algorithms import ALGORITHMS
from privdl.errors import ConfigError, PrivdlError
from privdl.experiment.backends import BACKENDS
from privdl.mechanisms import MECHANISMS
from privdl.network.mixing import MIXING_RULES
from privdl.network.dynamics import DYNAMICS
from privdl.network.topology import TOPOLOGIES
from privdl.plugins import check_names, load_plugins, merged
from privdl.registry import OneOf, annotated_choices, annotated_recorded, one_of
from privdl.runtime_spec import DEFAULT_SLICES, RuntimeSpec
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
#: [runtime]: where a run's agents live (docs/CONFIG.md). Absent from a config, the run is the simulator's and its
#: run id is what it was before the section existed.
RUNTIME_FIXED: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "backend": (str, "simulator"),
    "slices": (int, None),
    "assignment": (list, None),
    "checkpoint_every": (int, None),
    "procs": (int, None),
    "timeout": ((int, float), None),
    "keys": (str, "root"),
    "agents_per_process": (int, None),
    "transport": (str, "gloo"),
    "identity": (str, "none"),
    "roster": (str, None),
    "identity_dir": (str, None),
    "frame": (str, None),
}
RUNTIME_KEYS = ("root", "agreed")
RUNTIME_IDENTITIES = ("none", "ed25519")
RUNTIME_TRANSPORTS = ("gloo", "nccl")
RUNTIME_FRAMES = ("network", "held")
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


def _check_value(dotted: str, value: Any) -> None:
    """Rules every parameter obeys, whatever its builder checks: finite numbers (no parameter means anything by nan
    or ±inf; they would run and print nan), non-negative seeds (numpy's generators refuse the others deep inside a
    run) and non-empty paths."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"key {dotted!r} is {value}; give a finite number")
    if isinstance(value, float) and 0.0 < abs(value) < sys.float_info.min:
        raise ConfigError(f"key {dotted!r} is {value}, below the smallest normal double ({sys.float_info.min:.3g}): "
                          "no parameter means anything this small (its square is 0); give 0 or a larger value")
    if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
        raise ConfigError(f"key {dotted!r} is {value}, beyond 64-bit integers (TOML's range, and the arrays')")
    if isinstance(value, list):
        for v in value:
            _check_value(dotted, v)
    name = dotted.rpartition(".")[2]
    if name in PATH_KEYS and value == "":
        raise ConfigError(f"key {dotted!r} is empty; give a path, or leave the key out")
    if (name == "seed" or name.endswith("_seed")) and isinstance(value, int) and not isinstance(value, bool) \
            and value < 0:
        raise ConfigError(f"key {dotted!r} is a random seed and must be >= 0, got {value}")


def _accepts(annotation: Any, value: Any) -> bool:
    if annotation is inspect.Parameter.empty or annotation is Any:
        return True
    if typing.get_origin(annotation) is typing.Annotated:
        return _accepts(typing.get_args(annotation)[0], value)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if origin in (list, tuple):  # list[float]: each element too
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return isinstance(value, (list, tuple)) and (len(args) != 1 or all(_accepts(args[0], v) for v in value))
    if annotation in (list, tuple):  # a bare list (anchors, target): numbers, or lists of numbers
        return isinstance(value, (list, tuple)) and _numbers(value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _numbers(value: Any) -> bool:
    """Whether ``value`` is a number or a (nested) list of numbers."""
    if isinstance(value, (list, tuple)):
        return all(_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_name(annotation: Any) -> str:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return getattr(annotation, "__name__", str(annotation)).replace("typing.", "")


def _check_choice(dotted: str, value: Any, choices: list[OneOf]) -> None:
    for c in choices:
        if not c.accepts(value):
            shown = value.get("name") if isinstance(value, dict) else value
            raise ConfigError(f"key {dotted!r}: unknown {c.concept()} {shown!r}; valid names: {c.valid()}")


def parse_value(text: str) -> Any:
    """A --set value: parsed as a TOML value when possible (numbers, booleans, lists, quoted strings), else text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def set_dotted(cfg: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = cfg
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {key!r}: {p!r} is not a table")
    node[parts[-1]] = value


def load_config(path: str | Path, overrides: list[str] | None = None, *, validate: bool = True,
                plugins: list[str] | tuple[str, ...] = ()) -> dict:
    """Read a TOML config, apply ``--set key=value`` overrides (dotted keys), add ``plugins`` (``--plugin``) to its
    ``plugins`` and validate it (its plug-ins imported first, then every key, type and registry name of every grid
    point: a misspelled name fails here, not when a run is built)."""
    from privdl.data.files import read_text

    path = Path(path)
    text = read_text(path, "config file")  # missing, a folder, empty, not UTF-8/UTF-16 text: an error naming it
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        hint = (" (it looks like JSON, e.g. an experiment.json: privdl reads a TOML config, see docs/CONFIG.md)"
                if text.lstrip().startswith(("{", "[{", "[\n")) or path.suffix == ".json" else "")
        raise ConfigError(f"config file {path} is not valid TOML: {exc}{hint}") from None
    cfg.setdefault("base_dir", str(path.resolve().parent))
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        value = parse_value(text.strip())
        if key.strip().rpartition(".")[2] in PATH_KEYS and isinstance(value, str):
            value = str(Path(value).resolve())  # typed in a shell: relative to the current folder
        set_dotted(cfg, key.strip(), value)
    if plugins:
        cfg["plugins"] = merged(cfg.get("plugins"), plugins)
    if validate:
        expand(cfg)
    return cfg


@dataclass
class Axis:
    """One sweep axis: its column name and its values; bundle axes map labels to override tables."""

    name: str
    values: list[Any]
    bundles: list[dict] | None = None


@dataclass
class RunSpec:
    run_id: str
    config: dict  # effective config: only keys the chosen components accept
    sweep: dict[str, Any]  # axis name -> value for this run (None where the axis does not apply)


def _axes(cfg: dict) -> list[Axis]:
    axes: list[Axis] = []
    sweep = cfg.get("sweep", {})
    if not isinstance(sweep, dict):
        raise ConfigError("[sweep] must be a table of 'section.key' = [values]")
    for name, values in sweep.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep axis {name!r} must be a non-empty list")
        if name == "plugins" or any(isinstance(v, dict) and "plugins" in v for v in values):
            raise ConfigError("plugins cannot be swept: they are imported before the grid is built; list them all "
                              "in the top-level plugins")
        if all(isinstance(v, dict) for v in values):
            labels = []
            for v in values:
                if "label" not in v:
                    raise ConfigError(f"every table of sweep axis {name!r} needs a 'label'")
                labels.append(v["label"])
            axes.append(Axis(name, labels, [{k: x for k, x in v.items() if k != "label"} for v in values]))
        else:
            if "." not in name and name not in TOP_LEVEL:
                raise ConfigError(f"sweep axis {name!r} must be a dotted key like 'mechanism.epsilon'")
            axes.append(Axis(name, values))
    seeds = cfg.get("seeds")
    if seeds is not None and "seed" in cfg:  # the seed axis would overwrite it: one of them would be ignored
        raise ConfigError(f"give either 'seed' (one run seed, got {cfg['seed']!r}) or 'seeds' (a seed axis, got "
                          f"{seeds!r}), not both")
    if seeds is not None:
        if isinstance(seeds, int):
            seeds = list(range(seeds))
        if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds) or not seeds:
            raise ConfigError(f"'seeds' must be a list of integers or a count, got {seeds!r}")
        axes.append(Axis("seed", seeds))
    return axes


def _apply(base: dict, overrides: dict) -> None:
    for key, value in overrides.items():
        if isinstance(value, dict) and key in SECTIONS | {"network": None}:
            for k, v in value.items():
                set_dotted(base, f"{key}.{k}", v)
        else:
            set_dotted(base, key, value)


def _grid(cfg: dict) -> list[tuple[dict, dict, set[str]]]:
    """(merged config, sweep values, keys set by sweep) for each grid point."""
    base = {k: copy.deepcopy(v) for k, v in cfg.items() if k not in ("sweep", "seeds")}
    axes = _axes(cfg)
    points = []
    for combo in itertools.product(*[range(len(a.values)) for a in axes]):
        merged = copy.deepcopy(base)
        values, swept = {}, set()
        for axis, k in zip(axes, combo):
            values[axis.name] = axis.values[k]
            if axis.bundles is not None:
                _apply(merged, axis.bundles[k])
                swept |= {f"{s}.{kk}" for s, v in axis.bundles[k].items() if isinstance(v, dict) for kk in v}
                swept |= {s for s, v in axis.bundles[k].items() if not isinstance(v, dict)}
            else:
                set_dotted(merged, axis.name, axis.values[k])
                swept.add(axis.name)
        points.append((merged, values, swept))
    return points


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


def _check_names(points: list[tuple[dict, dict, set[str]]]) -> None:
    """Every name of every grid point — each section's component (topology, task, algorithm, mechanism, schedule)
    and every key whose value is a registered name (dataset, partition, accountant, optimizer, mixing rule, ...) —
    is registered: checked before the sweep's keys, so that an unknown name is reported as such, with the valid
    names, and not as a sweep key no component of the experiment accepts."""
    for merged, _, _ in points:
        for section in ["network", *SECTIONS]:
            table = merged.get(section, {})
            if not isinstance(table, dict):
                continue  # _resolve reports it
            if section == "network" and table.get("file"):
                params: dict[str, inspect.Parameter] = {}
            else:
                name_key = "topology" if section == "network" else "name"
                default = "erdos_renyi" if section == "network" else DEFAULT_NAMES[section]
                params = _named_component_keys(section, table.get(name_key, default))
            for key, value in table.items():
                dotted = f"{section}.{key}"
                if dotted in FIXED_CHOICES:
                    _check_choice(dotted, value, [FIXED_CHOICES[dotted]])
                elif key in params:
                    _check_choice(dotted, value, annotated_choices(params[key].annotation))


def _resolve(merged: dict, swept: set[str], used: dict[str, set[str]]) -> dict:
    """Validate one merged config and keep only the keys its components accept."""
    out = resolve_top(merged)
    for section in ["network", *SECTIONS]:
        out[section] = resolve_table(section, merged.get(section, {}), swept, used)
    return out


def resolve_top(merged: dict) -> dict:
    """The top-level keys of a config (and its ``[runtime]`` table), checked, with their defaults; the component
    tables (``[network]``, ``[task]``, ...) are left to :func:`resolve_table`. An unknown key is an error naming the
    valid ones."""
    out: dict[str, Any] = {}
    for key, value in merged.items():
        if key in TOP_LEVEL:
            typ, _ = TOP_LEVEL[key]
            if not isinstance(value, typ) or isinstance(value, bool) and typ is int:
                raise ConfigError(f"key {key!r} must be {typ.__name__}, got {value!r}")
            if key in FIXED_CHOICES:
                _check_choice(key, value, [FIXED_CHOICES[key]])
            _check_value(key, value)
            out[key] = value
        elif key == "runtime":
            out["runtime"] = _runtime(value)
        elif key not in SECTIONS and key != "network":
            raise ConfigError(
                f"unknown key {key!r}; valid top-level keys: {', '.join(sorted([*TOP_LEVEL, 'runtime', 'seeds', 'sweep', 'network', *SECTIONS]))}"
            )
    for k, (_, default) in TOP_LEVEL.items():
        if default is not None:
            out.setdefault(k, default)
    if out.get("eavesdropper_window", 0) < 0:
        raise ConfigError(f"eavesdropper_window must be >= 0 (0: no eavesdropper), got {out['eavesdropper_window']}")
    if out["iterations"] < 1:
        raise ConfigError(f"iterations must be >= 1, got {out['iterations']}")
    for key, what in (("eval_every", "0: only the first and last round"), ("threads", "0: torch's default")):
        if out[key] < 0:
            raise ConfigError(f"{key} must be >= 0 ({what}), got {out[key]}")
    if out["threads"] >= 2**31:
        raise ConfigError(f"threads must be a number of threads (< 2^31), got {out['threads']}")
    if not DEVICE.fullmatch(out["device"]):
        raise ConfigError(f"device must be \"cpu\", \"cuda\", \"cuda:N\" or \"auto\", got {out['device']!r}")
    if out["batch_replicas"] < 0:
        raise ConfigError(f"batch_replicas must be >= 0 (0: automatic, 1: never stack runs), got "
                          f"{out['batch_replicas']}")
    return out


def resolve_table(section: str, table: Any, swept: set[str] = frozenset(), used: dict[str, set[str]] | None = None
                  ) -> dict:
    """One component table of a config (``section``: network, task, algorithm, mechanism or schedule), checked
    against its component's parameters: its name (the registry's error, with the valid names, for an unknown one),
    every key's type and choices, the required keys; keys only another component of the experiment accepts
    (``swept`` dotted keys, ``used`` keys per section) are dropped. Returns the effective table."""
    used = used or {}
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] must be a table")
    default_name = "erdos_renyi" if section == "network" else DEFAULT_NAMES[section]
    if section == "network" and table.get("dynamics", "static") != "static" and "topology" not in table:
        default_name = "complete"  # (a law of W(t) draws its own graphs: the topology is only its reference)
    name_key = "topology" if section == "network" else "name"
    name = table.get(name_key, default_name)
    registry = TOPOLOGIES if section == "network" else SECTIONS[section]
    if section == "network" and table.get("file"):
        given = sorted(k for k in ("topology", "n", "seed") if k in table)
        if given:
            raise ConfigError(f"[network] file = {table['file']!r} defines the graph: remove "
                              f"{', '.join('network.' + k for k in given)} (they would be ignored, and the "
                              "manifest would say otherwise)")
        allowed = {"file", "file_kind", "mixing", "lazy", "sparse", "directed", "dynamics", "peers"}
        extra = sorted(k for k in table if k not in allowed and f"network.{k}" not in swept)
        if extra:
            raise ConfigError(f"unknown key(s) {', '.join('network.' + k for k in extra)} for a network read "
                              f"from a file; valid keys: {', '.join(sorted(allowed))}")
        return {k: v for k, v in table.items() if k in allowed}
    params = _named_component_keys(section, name)
    fixed = NETWORK_FIXED if section == "network" else {"name": (str, None)}
    resolved: dict[str, Any] = {name_key: name}
    for key, value in table.items():
        if key == name_key:
            continue
        dotted = f"{section}.{key}"
        if key in fixed:
            typ = fixed[key][0]
            if not isinstance(value, typ) or (isinstance(value, bool) and typ == (int, str)):
                raise ConfigError(f"key {dotted!r} must be {typ}, got {value!r}")
            if isinstance(value, str) and dotted in FIXED_CHOICES:
                _check_choice(dotted, value, [FIXED_CHOICES[dotted]])
            _check_value(dotted, value)
            resolved[key] = value
        elif key == "seed" and value == "run" and section == "task" and key in params:
            resolved[key] = value  # the data partition follows the run seed
        elif key in params:
            if not _accepts(params[key].annotation, value):
                raise ConfigError(
                    f"key {dotted!r} must be {_type_name(params[key].annotation)}, got {value!r}"
                )
            _check_choice(dotted, value, annotated_choices(params[key].annotation))
            _check_value(dotted, value)
            resolved[key] = value
        elif dotted in swept or key in used.get(section, set()):
            continue  # applies to another component of this experiment
        else:
            valid = sorted(set(params) | set(fixed) - {"name"})
            raise ConfigError(
                f"unknown key {dotted!r} for {section} {name!r}; valid keys: {', '.join(valid) or '(none)'}"
                + (f" (registered names: {', '.join(registry.names())})" if section != "network" else "")
            )
    for k, p in params.items():
        if p.default is inspect.Parameter.empty and k not in resolved:
            raise ConfigError(f"missing key '{section}.{k}' required by {section} {name!r}")
        mark = annotated_recorded(p.annotation)  # a changed default: the run records the value it uses
        if mark is not None and k not in resolved and (mark.applies is None or mark.applies(resolved)):
            resolved[k] = p.default
    return resolved


def _runtime(table: Any) -> dict:
    """The [runtime] table, checked: backend, slices (1 … n, checked against n when the run is built) or an
    assignment (one list of agents per slice)."""
    if not isinstance(table, dict):
        raise ConfigError("[runtime] must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in RUNTIME_FIXED:
            raise ConfigError(f"unknown key 'runtime.{key}'; valid keys: {', '.join(RUNTIME_FIXED)}")
        typ = RUNTIME_FIXED[key][0]
        if not isinstance(value, typ) or isinstance(value, bool):
            what = typ.__name__ if isinstance(typ, type) else "a number"
            raise ConfigError(f"key 'runtime.{key}' must be {what}, got {value!r}")
        out[key] = value
    split = "slices" in out or "assignment" in out
    backend = out.setdefault("backend", "sliced" if split else "simulator")
    if backend not in BACKENDS:
        raise ConfigError(f"runtime.backend must be one of {', '.join(BACKENDS.names())}, got {backend!r}")
    if out.get("keys", "root") not in RUNTIME_KEYS:
        raise ConfigError(f"runtime.keys must be one of {', '.join(RUNTIME_KEYS)} (root: from the run's seed, "
                          f"reproducible; agreed: X25519 key agreement between the agents), got {out['keys']!r}")
    if out.get("identity", "none") not in RUNTIME_IDENTITIES:
        raise ConfigError(f"runtime.identity must be one of {', '.join(RUNTIME_IDENTITIES)} (ed25519: every agent's "
                          f"key exchange signed with its identity from runtime.roster), got {out['identity']!r}")
    if out.get("identity", "none") == "ed25519":
        if out.get("keys", "root") != "agreed":
            raise ConfigError("runtime.identity = \"ed25519\" authenticates the key agreement: set runtime.keys = "
                              "\"agreed\" (root keys are derived from the public seed, nothing to authenticate)")
        for key in ("roster", "identity_dir"):
            if not out.get(key):
                raise ConfigError(f"runtime.identity = \"ed25519\" needs runtime.{key} (privdl keys generate "
                                  "--agents N --out DIR writes DIR/roster.json and DIR/identities)")
    elif "roster" in out or "identity_dir" in out:
        raise ConfigError("runtime.roster / runtime.identity_dir are read only with runtime.identity = \"ed25519\"")
    if out.get("transport", "gloo") not in RUNTIME_TRANSPORTS:
        raise ConfigError(f"runtime.transport must be one of {', '.join(RUNTIME_TRANSPORTS)}, got "
                          f"{out['transport']!r}")
    if out.get("frame", "network") not in RUNTIME_FRAMES:
        raise ConfigError(f"runtime.frame must be one of {', '.join(RUNTIME_FRAMES)} (network: every engine's "
                          f"tensors have one row per agent of the network; held: one per agent it holds), got "
                          f"{out['frame']!r}")
    if out.get("frame") == "held" and backend not in ("sliced", "dist"):
        raise ConfigError("runtime.frame = \"held\" is the frame of an engine holding some agents: set "
                          "runtime.backend = \"sliced\" or \"dist\" (the simulator holds every agent)")
    if "agents_per_process" in out and out["agents_per_process"] < 1:
        raise ConfigError(f"runtime.agents_per_process must be >= 1, got {out['agents_per_process']}")
    if "agents_per_process" in out and "assignment" in out:
        raise ConfigError("runtime.agents_per_process and runtime.assignment both place the agents: give one")
    if "procs" in out and out["procs"] < 1:
        raise ConfigError(f"runtime.procs must be >= 1 (processes), got {out['procs']}")
    if "timeout" in out and not (out["timeout"] > 0 and math.isfinite(out["timeout"])):
        raise ConfigError(f"runtime.timeout must be > 0 (seconds a receive may wait), got {out['timeout']}")
    if "checkpoint_every" in out and out["checkpoint_every"] < 1:
        raise ConfigError(f"runtime.checkpoint_every must be >= 1 (rounds between checkpoints), got "
                          f"{out['checkpoint_every']}")
    if "slices" in out and out["slices"] < 1:
        raise ConfigError(f"runtime.slices must be >= 1 (slices hold the agents), got {out['slices']}")
    if "assignment" in out:
        parts = out["assignment"]
        if not parts or not all(isinstance(p, list) and p and all(isinstance(a, int) and not isinstance(a, bool)
                                                                   for a in p) for p in parts):
            raise ConfigError("runtime.assignment must be a list of non-empty lists of agent indices, e.g. "
                              "[[0, 3], [1, 2]]")
    if backend != "dist" and ("agents_per_process" in out or "transport" in out or "procs" in out):
        which = next(k for k in ("agents_per_process", "transport", "procs") if k in out)
        raise ConfigError(f"runtime.{which} places or joins processes: set runtime.backend = \"dist\" (or run with "
                          "--procs K)")
    if backend == "simulator" and split:
        raise ConfigError("runtime.slices / runtime.assignment split a run: set runtime.backend = \"sliced\"")
    if backend == "sliced" and "slices" not in out and "assignment" not in out:
        out["slices"] = DEFAULT_SLICES
    return out


def _keys_accepted_anywhere(points: list[tuple[dict, dict, set[str]]]) -> dict[str, set[str]]:
    """For each section, every key some component used in the experiment accepts."""
    used: dict[str, set[str]] = {}
    for merged, _, _ in points:
        for section in ["network", *SECTIONS]:
            table = merged.get(section, {})
            if not isinstance(table, dict):
                continue
            name_key = "topology" if section == "network" else "name"
            default = "erdos_renyi" if section == "network" else DEFAULT_NAMES[section]
            try:
                used.setdefault(section, set()).update(_component_keys(section, table.get(name_key, default)))
            except PrivdlError:
                pass
    return used


def _check_swept_keys(points: list[tuple[dict, dict, set[str]]], used: dict[str, set[str]]) -> None:
    """Every key a sweep sets (an axis like ``"mechanism.epsilon"`` or a key inside a bundle) must be accepted by some
    component of the experiment: a misspelled axis would otherwise be dropped and the grid collapse silently."""
    for _, _, swept in points:
        for dotted in sorted(swept):
            if "." not in dotted:
                continue  # a top-level key, checked with the config
            section, key = dotted.split(".", 1)
            if section not in ("network", *SECTIONS):
                raise ConfigError(f"sweep key {dotted!r}: unknown section [{section}]; sections: network, "
                                  f"{', '.join(SECTIONS)}")
            fixed = NETWORK_FIXED if section == "network" else {"name": None}
            if "." in key or not (key in fixed or key in used.get(section, set())):
                valid = sorted(used.get(section, set()) | set(fixed))
                raise ConfigError(f"sweep key {dotted!r} is not a key of any [{section}] component in this "
                                  f"experiment (misspelled?); valid keys: {', '.join(valid)}")


#: top-level keys that do not change what a run computes (labels, threads, where it runs — device, [runtime]: the
#: sliced backend and checkpoints give the simulator's numbers —, how it is batched, the config file's folder), and
#: keys within sections that say only where inputs lie: none of them is in a run's id
NOT_IDENTITY = ("name", "description", "threads", "device", "batch_replicas", "base_dir", "runtime", "plugins")
LOCATION_KEYS = {"task": ("data_dir",)}  # the dataset's name says which data; its folder differs between machines


def without_locations(cfg: dict) -> dict:
    """``cfg`` without :data:`LOCATION_KEYS`: the same runs on another machine, with the data in another folder,
    are the same runs (and a folder of them the same experiment)."""
    out = dict(cfg)
    for section, keys in LOCATION_KEYS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return out


@functools.lru_cache(maxsize=256)
def _legacy_values(section: str, name: str | None) -> tuple[tuple[str, object], ...]:
    """(key, legacy value) of the :class:`~privdl.registry.Recorded` parameters of one component (``name`` None:
    of every component of the section — an experiment's table whose name is swept)."""
    if name is None:
        return tuple(dict.fromkeys(kv for n in SECTIONS[section].names() for kv in _legacy_values(section, n)))
    try:
        params = _component_keys(section, name)
    except (PrivdlError, TypeError, ValueError):  # an unknown name: validation reports it elsewhere
        return ()
    marks = ((k, annotated_recorded(p.annotation)) for k, p in params.items())
    return tuple((k, m.legacy) for k, m in marks if m is not None)


def _without_legacy(cfg: dict) -> dict:
    """``cfg`` less every :class:`~privdl.registry.Recorded` key set to its legacy value (``dp_sgd``'s ``accountant =
    "rdp"``): the runs made before the key existed used that value, and keep their ids (and an experiment naming it
    is the experiment that ran them)."""
    out = dict(cfg)
    for section in SECTIONS:
        table = out.get(section)
        if not isinstance(table, dict):
            continue
        name = table.get("name")
        drop = [k for k, legacy in _legacy_values(section, name if isinstance(name, str) else None)
                if k in table and table[k] == legacy]
        if drop:
            out[section] = {k: v for k, v in table.items() if k not in drop}
    return out


def identity(effective: dict) -> dict:
    """What a run's numbers depend on: the config less :data:`NOT_IDENTITY` and the data's folders — plus the key
    mode when the keys are agreed (``runtime.keys = "agreed"``: other noise than the root seed's, so another run).
    A key whose default changed (:class:`~privdl.registry.Recorded`) is in it unless it holds the value runs used
    before it existed: a config naming ``accountant = "rdp"`` for ``dp_sgd`` is the run made before PLD was the
    default, the same config without it (resolved to "pld") another run."""
    out = without_locations(_without_legacy({k: v for k, v in effective.items() if k not in NOT_IDENTITY}))
    keys = RuntimeSpec.of(effective).keys
    if keys != "root":
        out["keys"] = keys
    return out


def run_id(effective: dict) -> str:
    return _digest(identity(effective))


def predating_run_id(effective: dict) -> str:
    """The id the run of ``effective`` has if it was made before its :class:`~privdl.registry.Recorded` keys existed,
    i.e. with their legacy values (``dp_sgd`` under RDP). An experiment.json written before a default changed names
    no such key, and expands today to the new default: :func:`privdl.reproductions.common.finished_runs` takes a
    grid point's predating run when the folder holds no run of the point under today's id."""
    legacy = {}
    for section, table in effective.items():
        if isinstance(table, dict) and isinstance(table.get("name"), str):
            pairs = dict(_legacy_values(section, table["name"]))
            if pairs:
                legacy[section] = {**table, **{k: v for k, v in pairs.items() if k in table}}
    return run_id({**effective, **legacy})


def legacy_run_id(effective: dict) -> str:
    """The id privdl ≤ 2026-11-24 gave a run (its data folder included): :func:`privdl.experiment.store.merge`
    re-keys such runs."""
    return _digest({k: v for k, v in effective.items() if k not in NOT_IDENTITY})


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def expand(cfg: dict) -> tuple[list[RunSpec], list[str]]:
    """All grid points of an experiment (deduplicated; several may share one run_id) and its sweep axes."""
    load_plugins(check_names(cfg.get("plugins"), "key 'plugins'"))  # before any name is checked
    axes = [a.name for a in _axes(cfg)]
    points = _grid(cfg)
    _check_names(points)  # an unknown name first: its keys would otherwise be "not a key of any component"
    used = _keys_accepted_anywhere(points)
    _check_swept_keys(points, used)
    runs: dict[tuple, RunSpec] = {}
    for merged, values, swept in points:
        eff = _resolve(merged, swept, used)
        rid = run_id(eff)
        applied = {}
        for axis, value in values.items():
            if axis == "seed" or "." not in axis:
                applied[axis] = value
                continue
            section, key = axis.split(".", 1)
            applied[axis] = value if key in eff.get(section, {}) else None
        key = (rid, json.dumps(applied, sort_keys=True, default=str))
        if key not in runs:  # the same run may appear under several labels; it is executed once
            runs[key] = RunSpec(rid, eff, applied)
    return list(runs.values()), axes
