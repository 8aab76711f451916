"""A run's identity and id: what its numbers depend on (the effective config less labels, threads, device,
``[runtime]``, plug-ins and the data's folders; plus the key mode when keys are agreed), hashed into the 12-digit run
id; and the ids the same run had before a default changed (:class:`~privdl.registry.Recorded` keys) or before the
data's folder was left out.

Separate from validation (:mod:`privdl.experiment.config_resolve`): the results store, the runner and the
reproductions need a run's id for configs validated long ago, and the rules here decide which stored runs are the
same run — a change to them re-keys results, one to validation does not.
"""

from __future__ import annotations

import functools
import hashlib
import json

from privdl.errors import PrivdlError
from privdl.experiment.config_schema import SECTIONS, _component_keys
from privdl.registry import annotated_recorded
from privdl.runtime_spec import RuntimeSpec

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
