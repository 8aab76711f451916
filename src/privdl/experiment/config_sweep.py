"""The sweep of an experiment: its axes (``[sweep]`` keys, bundle tables with labels, ``seeds``) and the grid of
merged configs they span, one per combination of axis values, each with the keys the sweep set; and the dotted-key
overrides (``"mechanism.epsilon"``) that both the grid and ``--set`` apply.

Separate from the validation of each grid point (:mod:`privdl.experiment.config_resolve`): the grid is built before
any key is checked, and which keys a sweep set decides which unknown keys are errors.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

from privdl.errors import ConfigError
from privdl.experiment.config_schema import SECTIONS, TOP_LEVEL

def set_dotted(cfg: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = cfg
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {key!r}: {p!r} is not a table")
    node[parts[-1]] = value


@dataclass
class Axis:
    """One sweep axis: its column name and its values; bundle axes map labels to override tables."""

    name: str
    values: list[Any]
    bundles: list[dict] | None = None


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
