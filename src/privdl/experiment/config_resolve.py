"""One grid point of a config, validated and resolved: the top-level keys (with the ``[runtime]`` table) and each
component table (``[network]``, ``[task]``, ``[algorithm]``, ``[mechanism]``, ``[schedule]``) checked against its
component's parameters, defaults filled in, and the keys only another swept component accepts dropped; before that,
every registered name of every grid point, and every key a sweep sets.

Separate from the sweep (:mod:`privdl.experiment.config_sweep`), which builds the points, and from the schema
(:mod:`privdl.experiment.config_schema`), which states the keys: this is the walk that applies the one to the other.
:func:`resolve_top` and :func:`resolve_table` are also what :func:`privdl.train` checks its keyword arguments with.
"""

from __future__ import annotations

import inspect
from typing import Any

from privdl.errors import ConfigError, PrivdlError
from privdl.experiment.config_runtime import _runtime
from privdl.experiment.config_schema import (
    DEFAULT_NAMES,
    DEVICE,
    FIXED_CHOICES,
    NETWORK_FIXED,
    SECTIONS,
    TOP_LEVEL,
    _component_keys,
    _named_component_keys,
)
from privdl.experiment.config_values import _accepts, _check_choice, _check_value, _type_name
from privdl.network.topology import TOPOLOGIES
from privdl.registry import annotated_choices, annotated_recorded

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
