"""An agreed-key run's secrets on disk, one file per agent, so that a run started again replays what it released.

Agreed keys come from fresh randomness at setup. If a run stopped after some rounds and its agents agreed anew when it
started again, every round it had released would be released a second time — on the same data and state, with new
independent noise and new lots — while the ledger counts each round once. So right after the agreement every process
writes each of its agents' secrets (its own 256-bit secret, the pairwise secrets of its pairs, the group secrets it
holds: :meth:`privdl.agreement.AgreedKeys.export`) to ``<folder>/agent-<i>.json`` (mode 0600 in a folder of
mode 0700, written atomically), and no round runs until every process has (:func:`privdl.agreement.agree`).
A run that starts again — resumed from a checkpoint, or from round 0 after a crash — loads them instead of agreeing:
every round it runs again draws the noise and lots it drew the first time. The runner removes the folder once the
run's results are saved. The secrets are never written to a manifest, a result or a log.

**Two phases.** The files are first written as ``agent-<i>.json.pending``; once every process has written its own,
each renames them to ``agent-<i>.json``; rounds start only once every process has renamed. So a final file anywhere
means every process wrote its pending ones, and rounds may have been released only if every file is final:
:meth:`SecretStore.state` tells a crash during setup (nothing released: agree anew) from secrets lost after it
(refused by :func:`privdl.agreement.agree`).

**Replay is safe only if the recomputation is the same.** Each file names its run: the salt (run id and W) and the
run's identity (``identity``: the configuration's digest, the privdl source, the input files' digests) — a replay
under other code or other data would send the same noise on other values, and the difference of the two releases
would remove it. A file of another run, agent, source or input, a damaged one, or one others may read is refused by
name; starting over then takes deleting the folder: a new release, under new keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Iterable

from privdl.errors import PrivdlError
from privdl.private_file import write_private

FORMAT = "privdl-agent-secrets/2"
PENDING = ".pending"


class KeyStoreError(PrivdlError):
    """A stored agent secret that cannot be used."""


def _name(members: Iterable[int]) -> str:
    return "-".join(str(int(m)) for m in members)


def _members(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in name.split("-"))


class SecretStore:
    """The per-agent secret files of one run in ``folder``: ``salt`` (the run's, which every file must name) and
    ``identity`` (what else the run's numbers depend on: config digest, source, inputs; every file must name it)."""

    def __init__(self, folder: str | Path, *, salt: bytes, identity: dict | None = None) -> None:
        self.folder, self.salt = Path(folder), bytes(salt)
        self.identity = json.loads(json.dumps(identity or {}, sort_keys=True, default=str))

    def path(self, agent: int, pending: bool = False) -> Path:
        return self.folder / f"agent-{int(agent)}.json{PENDING if pending else ''}"

    def state(self, agents: Iterable[int]) -> tuple[list[int], list[int], list[int]]:
        """(agents whose final file exists, agents with only a pending one, agents with neither)."""
        final, pending, none = [], [], []
        for a in (int(x) for x in agents):
            (final if self.path(a).is_file() else pending if self.path(a, True).is_file() else none).append(a)
        return final, pending, none

    def save(self, agent: int, secrets: dict) -> None:
        """Write agent ``agent``'s secrets (:meth:`AgreedKeys.export`) as its pending file."""
        body = json.dumps({
            "format": FORMAT, "salt": self.salt.hex(), "identity": self.identity, "agent": int(agent),
            "own": secrets["own"].hex(),
            "pairs": {_name(k): v.hex() for k, v in sorted(secrets["pairs"].items())},
            "groups": {_name(k): v.hex() for k, v in sorted(secrets["groups"].items())}}, sort_keys=True).encode()
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        write_private(self.path(agent, True), hashlib.sha256(body).hexdigest().encode() + b"\n" + body)

    def commit(self, agents: Iterable[int]) -> None:
        """Rename the agents' pending files to their final names (every process has written its pending ones)."""
        for a in agents:
            os.replace(self.path(a, True), self.path(a))

    def discard(self, agents: Iterable[int]) -> None:
        """Remove the agents' files, pending and final (a setup that released nothing, agreed again)."""
        for a in agents:
            for pending in (False, True):
                self.path(a, pending).unlink(missing_ok=True)

    def load(self, agent: int) -> dict:
        """Agent ``agent``'s secrets, checked to be this run's, this agent's and this code's and inputs'."""
        path = self.path(agent)
        try:
            mode = path.stat().st_mode
            blob = path.read_bytes()
        except OSError as exc:
            raise KeyStoreError(f"cannot read the secrets of agent {agent} ({path}): {exc.strerror or exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyStoreError(f"the secrets file {path} of agent {agent} may be read by other users (mode "
                                f"{stat.S_IMODE(mode):04o}): chmod 600 {path}, if no one else could have read it")
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
            diff = sorted(k for k in {*self.identity, *data["identity"]}
                          if self.identity.get(k) != data["identity"].get(k))
            if diff:
                raise KeyStoreError(
                    f"the secrets file {path} of agent {agent} was written by a run with another {', '.join(diff)} "
                    f"(written: {data['identity'].get(diff[0])!r}, now: {self.identity.get(diff[0])!r}): replaying "
                    "its rounds with other code or inputs would send the same noise on other values, and the "
                    f"difference of two releases removes it. Delete {self.folder} (and the run's checkpoints) to "
                    "start the run over as a new release under new keys")
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
