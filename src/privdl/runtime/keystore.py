"""An agreed-key run's secrets on disk, one file per agent, so that a run started again replays what it released.

Agreed keys come from fresh randomness at setup. If a run stopped after some rounds and its agents agreed anew when it
started again, every round it had released would be released a second time — on the same data and state, with new
independent noise and new lots — while the ledger counts each round once. So right after the agreement every process
writes each of its agents' secrets (its own 256-bit secret, the pairwise secrets of its pairs, the group secrets it
holds: :meth:`privdl.runtime.agreement.AgreedKeys.export`) to ``<folder>/agent-<i>.json`` (mode 0600, written
atomically), and no round runs until every process has (:func:`privdl.runtime.agreement.agree`). A run that starts
again — resumed from a checkpoint, or from round 0 after a crash — loads them instead of agreeing: every round it
runs again draws the noise and lots it drew the first time. The runner removes the folder once the run's results are
saved. The secrets are never written to a manifest, a result or a log.

Each file names its run (the salt: run id and W) and its agent, and carries the SHA-256 of its contents; a file of
another run or agent, or a damaged one, is refused by name.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Iterable

from privdl.errors import PrivdlError
from privdl.private_file import write_private

FORMAT = "privdl-agent-secrets/1"


class KeyStoreError(PrivdlError):
    """A stored agent secret that cannot be used."""


def _name(members: Iterable[int]) -> str:
    return "-".join(str(int(m)) for m in members)


def _members(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in name.split("-"))


class SecretStore:
    """The per-agent secret files of one run in ``folder`` (``salt``: the run's, which every file must name)."""

    def __init__(self, folder: str | Path, *, salt: bytes) -> None:
        self.folder, self.salt = Path(folder), bytes(salt)

    def path(self, agent: int) -> Path:
        return self.folder / f"agent-{int(agent)}.json"

    def present(self, agents: Iterable[int]) -> tuple[list[int], list[int]]:
        """(agents whose file exists, agents whose file does not)."""
        agents = [int(a) for a in agents]
        have = [a for a in agents if self.path(a).is_file()]
        return have, [a for a in agents if a not in have]

    def save(self, agent: int, secrets: dict) -> None:
        """Write agent ``agent``'s secrets (:meth:`AgreedKeys.export`)."""
        body = json.dumps({
            "format": FORMAT, "salt": self.salt.hex(), "agent": int(agent), "own": secrets["own"].hex(),
            "pairs": {_name(k): v.hex() for k, v in sorted(secrets["pairs"].items())},
            "groups": {_name(k): v.hex() for k, v in sorted(secrets["groups"].items())}}, sort_keys=True).encode()
        self.folder.mkdir(parents=True, exist_ok=True)
        write_private(self.path(agent), hashlib.sha256(body).hexdigest().encode() + b"\n" + body)

    def load(self, agent: int) -> dict:
        """Agent ``agent``'s secrets, checked to be this run's and this agent's."""
        path = self.path(agent)
        try:
            blob = path.read_bytes()
        except OSError as exc:
            raise KeyStoreError(f"cannot read the secrets of agent {agent} ({path}): {exc.strerror or exc}") from None
        digest, _, body = blob.partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != digest:
            raise KeyStoreError(f"the secrets file {path} of agent {agent} is truncated or corrupt (its SHA-256 "
                                "does not match); the run cannot replay its released rounds without it")
        try:
            data = json.loads(body)
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            if data["salt"] != self.salt.hex():
                raise KeyStoreError(f"the secrets file {path} is of another run (its salt differs: another run id "
                                    f"or mixing matrix) — agent {agent}")
            if int(data["agent"]) != int(agent):
                raise KeyStoreError(f"the secrets file {path} holds agent {data['agent']}'s secrets, not agent "
                                    f"{agent}'s (a swapped file)")
            return {"own": bytes.fromhex(data["own"]),
                    "pairs": {_members(k): bytes.fromhex(v) for k, v in data["pairs"].items()},
                    "groups": {_members(k): bytes.fromhex(v) for k, v in data["groups"].items()}}
        except KeyStoreError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise KeyStoreError(f"the secrets file {path} of agent {agent} is not a privdl secrets file ({exc})") \
                from None

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def forget(folder: str | Path, agents: Iterable[int]) -> None:
    """Remove the secret files of ``agents`` from ``folder`` (their run is saved), and the folder once empty."""
    folder = Path(folder)
    for a in agents:
        (folder / f"agent-{int(a)}.json").unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # other processes' files are still there, or it never existed
        pass


__all__ = ["FORMAT", "KeyStoreError", "SecretStore", "forget"]
