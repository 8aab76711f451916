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

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privdl.errors import ConfigError
from privdl.experiment.config_resolve import _check_names, _check_swept_keys, _keys_accepted_anywhere, _resolve
from privdl.experiment.config_schema import PATH_KEYS
from privdl.experiment.config_sweep import _axes, _grid, set_dotted
from privdl.experiment.run_identity import run_id
from privdl.plugins import check_names, load_plugins, merged

def parse_value(text: str) -> Any:
    """A --set value: parsed as a TOML value when possible (numbers, booleans, lists, quoted strings), else text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


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
class RunSpec:
    run_id: str
    config: dict  # effective config: only keys the chosen components accept
    sweep: dict[str, Any]  # axis name -> value for this run (None where the axis does not apply)


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
