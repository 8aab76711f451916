"""The ``[runtime]`` table of a config, checked: where a run's agents live (the backend, its slices or processes, an
assignment of agents) and how they talk (transport, key mode, identities, frame). docs/CONFIG.md lists its keys.

Separate from the component tables (:mod:`privdl.experiment.config_resolve`): ``[runtime]`` names no registered
component and is not part of a run's identity (a sliced or distributed run gives the simulator's numbers), and its
rules are those of the backends, not of the builders' parameters. :class:`privdl.runtime_spec.RuntimeSpec` is its
typed form, read after this check.
"""

from __future__ import annotations

import math
from typing import Any

from privdl.errors import ConfigError
from privdl.experiment.backends import BACKENDS
from privdl.runtime_spec import DEFAULT_SLICES

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
