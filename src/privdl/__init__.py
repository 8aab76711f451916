"""privdl: privacy-preserving decentralized learning.

The agent axis: every per-agent quantity is a tensor whose leading axis is the agent. See README.md.
"""

__version__ = "0.1.0"

# Importing privdl changes no environment variable. The thread and page settings privdl's own processes run with
# (GOMP_SPINCOUNT, THP_MEM_ALLOC_ENABLE: BENCHMARKS.md) are set by its entry points before torch loads — the privdl
# command, ``python -m privdl.runtime`` workers, and the --jobs / --procs processes they spawn:
# privdl.process_defaults, whose ``apply()`` a script of your own may call before importing torch.

#: the public face (privdl.library, the top room), loaded on the first use of one of these names: ``import privdl``
#: alone loads no torch
_PUBLIC = (
    "ACCOUNTANTS", "ALGORITHMS", "DATASETS", "MECHANISMS", "MESSAGE_MECHANISMS", "MIXING_RULES", "MODELS",
    "PARTITIONERS", "SCHEDULES", "TASKS", "TOPOLOGIES",
    "Algorithm", "ConfigError", "CorrelatedGaussian", "GradientMechanism", "Ledger", "MechanismEnv",
    "MessageMechanism", "Network", "PrivdlError", "Result", "Schedule", "StepContext", "Task", "UnknownNameError",
    "ValidationError", "task_from_arrays", "train",
)


def __getattr__(name: str) -> object:
    """``privdl.train``, ``privdl.Network``, ...: the public names (:data:`_PUBLIC`), from privdl.library."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'privdl' has no attribute {name!r}")
    from privdl import library  # the facade room, above every other: imported on first use only

    value = getattr(library, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


_SOURCE_HASH: str | None = None


def source_hash() -> str:
    """SHA-256 (first 16 hex digits) of privdl's Python sources and packaged configs, in path order: which code
    produced a result, installed from a commit or not (written in every manifest)."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        import hashlib
        from pathlib import Path

        root = Path(__file__).parent
        h = hashlib.sha256()
        for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".toml") and p.is_file()):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
        _SOURCE_HASH = h.hexdigest()[:16]
    return _SOURCE_HASH
