"""A run's ``[runtime]`` table as a typed, frozen value: where its agents live (backend, slices or an assignment,
processes), where its shared randomness comes from (keys, identities) and how it survives interruption (timeout,
checkpoints). docs/CONFIG.md, "[runtime]", says what each key means.

The config stays the dict it is (its JSON, manifests and run ids do not change): :meth:`RuntimeSpec.of` is a view of
a config that :mod:`privdl.experiment.config` has validated, and every reader of ``[runtime]`` goes through it. A
room of its own near the bottom (docs/ARCHITECTURE.md, "Rooms and their order"), so that every reader may import it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from privdl.errors import ConfigError

#: seconds a receive may wait before a run stops with an error naming the silent peer (``runtime.timeout``)
DEFAULT_TIMEOUT = 120.0
#: slices of a sliced run that names neither ``slices`` nor ``assignment``
DEFAULT_SLICES = 2


@dataclass(frozen=True)
class RuntimeSpec:
    """The ``[runtime]`` keys, with their defaults (a key the table leaves out)."""

    backend: str = "simulator"  # "simulator", "sliced" or "dist"; "sliced" when slices or assignment are given
    slices: int | None = None  # contiguous blocks of agents; DEFAULT_SLICES for a sliced run without an assignment
    assignment: tuple[tuple[int, ...], ...] | None = None  # the agents of each slice or process
    checkpoint_every: int | None = None  # rounds between checkpoints (None: no checkpoints)
    procs: int | None = None  # dist: processes `privdl run` starts on this machine
    timeout: float = DEFAULT_TIMEOUT  # sliced, dist: seconds a receive may wait
    keys: str = "root"  # "root" (from the run's seed) or "agreed" (key agreement between the agents)
    agents_per_process: int | None = None  # dist: contiguous blocks of this many agents, one per process
    transport: str = "gloo"  # dist: "gloo" ("nccl" is refused)
    identity: str = "none"  # "none" or "ed25519" (the agreement's keys signed, checked against the roster)
    roster: str | None = None  # with ed25519: the roster file, relative to the config's folder
    identity_dir: str | None = None  # with ed25519: this host's private identities, relative to the config's folder
    frame: str | None = None  # "network" (n rows per engine) or "held" (one per held agent); None: the backend's
    # default — "held" for dist where the run allows it (else "network", the reason in the manifest), "network" else

    @classmethod
    def of(cls, cfg: dict) -> "RuntimeSpec":
        """The runtime of config ``cfg`` (a run's effective config, or an experiment's as ``load_config`` returns
        it): its ``[runtime]`` table, the keys it leaves out at their defaults."""
        return cls.of_table(cfg.get("runtime") or {})

    @classmethod
    def of_table(cls, table: dict) -> "RuntimeSpec":
        """The runtime a ``[runtime]`` table gives (checked by the config's validation; an unknown key is refused)."""
        unknown = sorted(set(table) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"unknown key 'runtime.{unknown[0]}'; valid keys: "
                              f"{', '.join(f.name for f in fields(cls))}")
        values = dict(table)
        split = "slices" in values or "assignment" in values
        values.setdefault("backend", "sliced" if split else "simulator")
        if values["backend"] == "sliced" and not split:
            values["slices"] = DEFAULT_SLICES
        if values.get("assignment") is not None:
            values["assignment"] = tuple(tuple(part) for part in values["assignment"])
        if values.get("timeout") is not None:
            values["timeout"] = float(values["timeout"])
        else:
            values.pop("timeout", None)
        return cls(**values)

    @property
    def agreed(self) -> bool:
        """Whether the run's keys are agreed between its agents (``keys = "agreed"``)."""
        return self.keys == "agreed"


__all__ = ["DEFAULT_SLICES", "DEFAULT_TIMEOUT", "RuntimeSpec"]
