"""Agent identities (``runtime.identity = "ed25519"``): long-term Ed25519 keys that authenticate the key exchange.

Without identities the X25519 exchange of :mod:`privdl.agreement` protects against passive attackers only:
anyone who can rewrite a link during setup, or any process of the run, may announce an X25519 key "for" an agent it
does not hold and stand in the middle. With identities every agent has an Ed25519 key pair; a **roster** (a public
file, the same on every host) gives each agent's public key, and each process holds the private keys of its agents
only (``runtime.identity_dir``, one file per agent, readable by its owner alone). Every X25519 public key then travels
with the signature of its agent's identity over (run salt, agent, X25519 key) — the salt names the run and its mixing
weights, so a signature from another run does not verify — and the receiver checks it against the roster before it
uses the key. A key signed by another agent's identity than the roster gives it is refused, naming both.

Files (``privdl keys generate --agents N --out DIR`` writes them):

* ``DIR/roster.json`` — ``{"format": "privdl-roster/1", "agents": {"0": "<hex Ed25519 public key>", ...}}``;
* ``DIR/identities/agent-<i>.pem`` — agent i's private key (PKCS#8 PEM, mode 0600; a file others may read is
  refused). Copy to each host only the files of the agents it runs.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Iterable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (Encoding, NoEncryption, PrivateFormat, PublicFormat,
                                                          load_pem_private_key)

from privdl.errors import PrivdlError
from privdl.runtime_spec import RuntimeSpec

ROSTER_FORMAT = "privdl-roster/1"
#: bytes of one signed announcement: the signer's Ed25519 public key and its signature
SIGNED = 32 + 64
IDENTITY_MODES = ("none", "ed25519")


class IdentityError(PrivdlError):
    """A roster, an identity file or a signed key that cannot be trusted."""


def _public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def fingerprint(public: bytes) -> str:
    """A short name of an Ed25519 public key (its first 8 bytes, hex)."""
    return public[:8].hex()


def statement(salt: bytes, agent: int, x25519_public: bytes) -> bytes:
    """What an agent's identity signs: its X25519 public key for this run (the salt names the run and W)."""
    return b"privdl/v1/x25519-announce\x1f" + salt + int(agent).to_bytes(8, "little") + x25519_public


def _private_file(folder: Path, agent: int) -> Path:
    return folder / f"agent-{agent}.pem"


def generate(agents: int, out: str | Path) -> tuple[Path, Path]:
    """Identities for ``agents`` agents in ``out``: the roster (public) and one private key file per agent (mode
    0600 in a folder of mode 0700). Refuses to overwrite an existing roster."""
    if isinstance(agents, bool) or not isinstance(agents, int) or agents < 1:
        raise IdentityError(f"--agents must be an integer >= 1, got {agents!r}")
    out = Path(out)
    roster = out / "roster.json"
    if roster.exists():
        raise IdentityError(f"{roster} exists: identities are generated once (delete the folder to make new ones, "
                            "and hand the new roster to every host)")
    folder = out / "identities"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    except OSError as exc:
        raise IdentityError(f"cannot create {folder}: {exc.strerror or exc}") from None
    publics = {}
    for i in range(agents):
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        path = _private_file(folder, i)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        os.chmod(path, 0o600)
        publics[str(i)] = _public_bytes(key.public_key()).hex()
    roster.write_text(json.dumps({"format": ROSTER_FORMAT, "agents": publics}, indent=1) + "\n")
    return roster, folder


class Roster:
    """Agent → Ed25519 public key, read from a roster file and checked to name every agent of the run."""

    def __init__(self, path: str | Path, n: int) -> None:
        self.path = Path(path)
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            raise IdentityError(f"roster {self.path} not found (runtime.roster; privdl keys generate writes one)") \
                from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise IdentityError(f"roster {self.path} cannot be read: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != ROSTER_FORMAT or not isinstance(data.get("agents"), dict):
            raise IdentityError(f"roster {self.path} is not a privdl roster (format {ROSTER_FORMAT!r} with a table of "
                                "agents)")
        self.keys: dict[int, bytes] = {}
        for name, value in data["agents"].items():
            try:
                agent, raw = int(name), bytes.fromhex(value)
                Ed25519PublicKey.from_public_bytes(raw)
            except (ValueError, TypeError):
                raise IdentityError(f"roster {self.path}: the key of agent {name!r} is not a 32-byte Ed25519 public "
                                    "key in hex") from None
            self.keys[agent] = raw
        missing = [i for i in range(n) if i not in self.keys]
        if missing:
            raise IdentityError(f"roster {self.path} has no key for agent {missing[0]}"
                                + (f" (nor for {len(missing) - 1} other agents)" if len(missing) > 1 else "")
                                + f"; the run has {n} agents")
        self.owner_of: dict[bytes, int] = {}
        for agent, raw in sorted(self.keys.items()):
            if raw in self.owner_of:
                raise IdentityError(f"roster {self.path} gives agents {self.owner_of[raw]} and {agent} the same key "
                                    f"({fingerprint(raw)}…): one identity could announce keys for both")
            self.owner_of[raw] = agent

    def name(self, public: bytes) -> str:
        """Who an Ed25519 key is in this roster."""
        agent = self.owner_of.get(public)
        return (f"agent {agent}'s identity" if agent is not None else
                f"an identity not in the roster ({fingerprint(public)}…)")


class Identities:
    """The roster and the private identities of the agents this process holds."""

    def __init__(self, roster: Roster, folder: str | Path, agents: Iterable[int]) -> None:
        self.roster, self.folder = roster, Path(folder)
        self.private: dict[int, Ed25519PrivateKey] = {}
        for i in agents:
            path = _private_file(self.folder, int(i))
            try:
                mode = path.stat().st_mode
            except FileNotFoundError:
                raise IdentityError(f"identity file {path} of agent {i} not found (runtime.identity_dir must hold "
                                    "the private identity of every agent this process runs)") from None
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise IdentityError(f"identity file {path} of agent {i} may be read by other users (mode "
                                    f"{stat.S_IMODE(mode):04o}): a private key must be its owner's alone — chmod 600 "
                                    f"{path}")
            try:
                key = load_pem_private_key(path.read_bytes(), password=None)
            except (OSError, ValueError, TypeError) as exc:
                raise IdentityError(f"identity file {path} of agent {i} is not an unencrypted PEM private key "
                                    f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
            if not isinstance(key, Ed25519PrivateKey):
                raise IdentityError(f"identity file {path} of agent {i} holds a {type(key).__name__}, not an Ed25519 "
                                    "key")
            if _public_bytes(key.public_key()) != roster.keys[int(i)]:
                raise IdentityError(f"identity file {path} holds another key than the roster {roster.path} gives "
                                    f"agent {i} ({fingerprint(_public_bytes(key.public_key()))}… against "
                                    f"{fingerprint(roster.keys[int(i)])}…)")
            self.private[int(i)] = key

    def sign(self, salt: bytes, agent: int, x25519_public: bytes) -> bytes:
        """The signed announcement's tail: the signer's public key and its signature (:data:`SIGNED` bytes)."""
        key = self.private[int(agent)]
        return _public_bytes(key.public_key()) + key.sign(statement(salt, agent, x25519_public))

    def verify(self, salt: bytes, agent: int, x25519_public: bytes, signed: bytes, *, sender: str) -> None:
        """Check agent ``agent``'s announced key against the roster; refuse, naming who signed it and for whom."""
        signer, signature = signed[:32], signed[32:SIGNED]
        want = self.roster.keys[int(agent)]
        if signer != want:
            raise IdentityError(f"{sender} announced an X25519 key for agent {agent} signed by "
                                f"{self.roster.name(signer)}; the roster {self.roster.path} gives agent {agent} the "
                                f"identity {fingerprint(want)}…: refused (a process may announce keys only for the "
                                "agents whose identities it holds)")
        try:
            Ed25519PublicKey.from_public_bytes(signer).verify(signature, statement(salt, agent, x25519_public))
        except InvalidSignature:
            raise IdentityError(f"{sender}: the signature of agent {agent}'s X25519 key does not verify for this run "
                                f"(a key signed for another run or another key, or forged); roster "
                                f"{self.roster.path}") from None


def load(runtime: RuntimeSpec, n: int, agents: Iterable[int], base_dir: str | None = None) -> Identities | None:
    """The identities a run's ``[runtime]`` asks for (None for ``identity = "none"``), paths relative to the
    config's folder."""
    if runtime.identity == "none":
        return None

    def path(key: str) -> Path:
        value = getattr(runtime, key)
        if not value:
            raise IdentityError(f"runtime.identity = \"ed25519\" needs runtime.{key} (privdl keys generate --agents N "
                                "--out DIR writes DIR/roster.json and DIR/identities)")
        p = Path(value).expanduser()
        return p if p.is_absolute() or base_dir is None else Path(base_dir) / p

    return Identities(Roster(path("roster"), n), path("identity_dir"), agents)


__all__ = ["IDENTITY_MODES", "Identities", "IdentityError", "Roster", "SIGNED", "generate", "load", "statement"]
