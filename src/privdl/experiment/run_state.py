"""What a run leaves on disk while it runs — its checkpoints (``runtime.checkpoint_every``) and an agreed-key run's
agent secrets — and the identity each is bound to (the run, what its numbers depend on, the code; the input files
for secrets), so that a restarted run resumes or replays only the same run.

Separate from the run's pipeline (:mod:`privdl.experiment.run_pipeline`): the runner's save step removes these
files, and the distributed runtime's workers bind their own checkpoints and secrets to the same identities.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import privdl
from privdl.experiment.build import input_files
from privdl.experiment.config import RunSpec
from privdl.runtime_spec import RuntimeSpec
from privdl.simulator.checkpoint import Checkpoints

def checkpoint_identity(spec: RunSpec) -> dict:
    """What a run's checkpoints are compared against on resume: the run, its configuration (what its numbers depend
    on: not where or how it runs — [runtime], threads, device —, so a run checkpointed by 2 slices resumes with 3 or
    in the simulator), the code."""
    from privdl.experiment.run_identity import identity

    what = identity(spec.config)
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"run_id": spec.run_id, "config_digest": digest, "source": privdl.source_hash()}


def run_checkpoints(specs: Sequence[RunSpec], n: int, folders: Sequence[Path] | None,
                    resume: bool) -> Checkpoints | None:
    """The checkpoints of a run (or of the runs of a stacked batch) when its config asks for them
    (``runtime.checkpoint_every``) and the runner gives their folders; without ``resume`` old ones are removed."""
    every = RuntimeSpec.of(specs[0].config).checkpoint_every
    if not every or folders is None:
        return None
    ck = Checkpoints(folders, [checkpoint_identity(s) for s in specs], n=n, every=int(every))
    if not resume:
        ck.clear()
    return ck


def secrets_folder(run_dir: Path) -> Path:
    """Where an agreed-key run keeps its agents' secrets until its results are saved."""
    return run_dir / "keys"


def secrets_identity(spec: RunSpec) -> dict:
    """What an agreed-key run's stored secrets are bound to besides its salt: a replay is safe only under the same
    configuration, privdl source and input files (:mod:`privdl.agreement.keystore`)."""
    return {**checkpoint_identity(spec), "inputs": input_files(spec.config)}
