"""privdl: privacy-preserving decentralized learning.

The agent axis: every per-agent quantity is a tensor whose leading axis is the agent. See README.md.
"""

import os as _os

__version__ = "0.1.0"

# Large tensors on transparent huge pages: PyTorch's own switch, read at its first allocation of 2 MiB or more, so it
# acts when privdl is imported before torch allocates a large tensor (always through the ``privdl`` command). Fresh
# activations otherwise cost one page fault per 4 KiB; a seed-004 CPU run takes 12–16× fewer faults and runs 1.14×
# faster at one thread where the kernel offers huge pages on request (BENCHMARKS.md). Nothing else changes: no value,
# no result. A value the user has set, e.g. THP_MEM_ALLOC_ENABLE=0, is kept; --jobs helpers inherit it.
_os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# Idle intra-op threads spin briefly, then sleep: torch's CPU wheel runs its thread pool on libgomp, whose idle threads
# spin 300 000 times before they sleep. Alone on the machine that costs nothing; beside other busy processes (several
# sweeps at once) a thread that spins holds a core that the pool's other thread needs, and every parallel region
# waits for a thread the system has descheduled: a CNN run took 3.1× longer beside two busy processes than alone,
# 2.2× with 3000 spins (tens of µs: still enough to catch a step's next parallel region, so no cost alone); passive
# waiting (no spin) costs 1.4× alone.
# Measured in BENCHMARKS.md, "A run beside busy processes". libgomp reads the variable when torch loads it, so this
# acts when privdl is imported before torch (always through the ``privdl`` command). Results do not change (only
# how idle threads wait). A user's own choice wins: any of these variables set leaves the policy alone. (Small runs
# take one thread and no pool at all: privdl.experiment.runner.auto_threads.)
if not any(k in _os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")):
    _os.environ["GOMP_SPINCOUNT"] = "3000"

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
