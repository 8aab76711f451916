"""Identities (``runtime.identity = "ed25519"``): every X25519 key of the agreement is signed by its agent's identity
and checked against the roster before use (issue 43).

An attacker who holds a process (or rewrites a link during setup) tries what the unauthenticated exchange lets it
do: announce a key for an agent it does not hold, signed with the identity it has; replay a key signed for another
run; change a key in transit. Each is refused with an error naming the agents and the roster. Bad files — a roster
without an agent, an identity others may read, an identity that is not the roster's — are refused by name.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from privdl.cli import app
from privdl.comm.transport import Transport
from privdl.network import Network
from privdl.placement import partition
from privdl.agreement import seeded_entropy
from privdl.agreement.identity import Identities, IdentityError, Roster, generate
from tests.conftest import agree_slices

N = 6
GROUPS = [(0, 2, 4)]


@pytest.fixture(scope="module")
def net():
    return Network.from_topology("ring", N)


@pytest.fixture
def ids(tmp_path):
    roster, folder = generate(N, tmp_path / "ids")
    return roster, folder


def _slices(ids, placements):
    roster, folder = ids
    r = Roster(roster, N)
    return [Identities(r, folder, p.agents) for p in placements]


def test_identities_sign_every_key_and_the_run_agrees(net, ids):
    """3 slices with identities agree on the same keys as without (the signatures change no secret: same entropy,
    same keys), and the announcements are 128 bytes each (key, signer, signature)."""
    placements = partition(N, slices=3)
    plain_t, signed_t = Transport(3, timeout=20), Transport(3, timeout=20)
    plain = agree_slices(net, GROUPS, placements, entropy=seeded_entropy(1), transport=plain_t)
    signed = agree_slices(net, GROUPS, placements, entropy=seeded_entropy(1), transport=signed_t,
                          identities=_slices(ids, placements))
    for a, b in zip(plain, signed):
        for i in a.agents:
            assert a.own("noise", [i])[0].tobytes() == b.own("noise", [i])[0].tobytes()
    extra = signed_t.setup_bytes - plain_t.setup_bytes
    assert extra > 0 and extra % 96 == 0  # a signer and a signature per announced key


class _Impostor(Identities):
    """A process that holds agent ``holds``'s identity and signs with it for agent ``claims`` too."""

    def __init__(self, base: Identities, claims: int, holds: Ed25519PrivateKey):
        self.__dict__.update(base.__dict__)
        self.private = {**base.private, claims: holds}


def test_a_key_signed_by_another_agents_identity_is_refused_naming_both(net, ids):
    """Slice 0 holds agents 0 and 1; it announces agent 1's key signed with agent 0's identity (it could not have
    agent 1's). Slice 1 refuses it, naming agent 1, agent 0's identity and the roster."""
    placements = partition(N, assignment=[[0, 1], [2, 3, 4, 5]])
    slices = _slices(ids, placements)
    slices[0] = _Impostor(slices[0], 1, slices[0].private[0])
    with pytest.raises(IdentityError, match=r"announced an X25519 key for agent 1 signed by agent 0's identity; the "
                                            r"roster .*roster.json gives agent 1"):
        agree_slices(net, GROUPS, placements, entropy=seeded_entropy(1), identities=slices)


def test_a_key_signed_by_an_identity_outside_the_roster_is_refused(net, ids):
    placements = partition(N, assignment=[[0, 1], [2, 3, 4, 5]])
    slices = _slices(ids, placements)
    slices[0] = _Impostor(slices[0], 1, Ed25519PrivateKey.generate())
    with pytest.raises(IdentityError, match="signed by an identity not in the roster"):
        agree_slices(net, GROUPS, placements, entropy=seeded_entropy(1), identities=slices)


class _OtherRun(Identities):
    """Signs its agents' keys as they were signed in another run (another salt): a replayed announcement."""

    def __init__(self, base: Identities):
        self.__dict__.update(base.__dict__)

    def sign(self, salt, agent, x25519_public):
        return super().sign(b"another run's salt", agent, x25519_public)


def test_a_signature_over_another_runs_key_does_not_verify(net, ids):
    placements = partition(N, slices=2)
    slices = _slices(ids, placements)
    slices[1] = _OtherRun(slices[1])
    with pytest.raises(IdentityError, match="process 1: the signature of agent 3's X25519 key does not verify for "
                                            "this run"):
        agree_slices(net, GROUPS, placements, entropy=seeded_entropy(1), identities=slices)


class _Tamper(Transport):
    def send(self, src, dst, header, payload):
        if header[1].endswith("public") and src == 0:
            payload = payload.clone()
            payload[0, 31] ^= 0x80  # the same X25519 secret (RFC 7748 masks the bit), another signed statement
        super().send(src, dst, header, payload)


def test_a_key_changed_in_transit_is_refused(net, ids):
    placements = partition(N, slices=2)
    with pytest.raises(IdentityError, match="process 0: the signature of agent 0's X25519 key does not verify"):
        agree_slices(net, GROUPS, placements, entropy=seeded_entropy(1), transport=_Tamper(2, timeout=20),
                     identities=_slices(ids, placements))


# ---- bad files ---------------------------------------------------------------------------------------------------
def test_a_roster_without_an_agent_is_refused_by_name(ids):
    roster, _ = ids
    data = json.loads(roster.read_text())
    del data["agents"]["4"]
    roster.write_text(json.dumps(data))
    with pytest.raises(IdentityError, match=r"roster .*roster.json has no key for agent 4"):
        Roster(roster, N)
    data["agents"]["4"] = "00" * 31
    roster.write_text(json.dumps(data))
    with pytest.raises(IdentityError, match="the key of agent '4' is not a 32-byte Ed25519 public key"):
        Roster(roster, N)
    data["agents"]["4"] = data["agents"]["1"]
    roster.write_text(json.dumps(data))
    with pytest.raises(IdentityError, match="gives agents 1 and 4 the same key"):
        Roster(roster, N)


def test_identity_files_others_may_read_missing_or_of_another_agent_are_refused(ids):
    roster, folder = ids
    r = Roster(roster, N)
    path = folder / "agent-2.pem"
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match=r"identity file .*agent-2.pem of agent 2 may be read by other users "
                                            r"\(mode 0644\)"):
        Identities(r, folder, [1, 2])
    os.chmod(path, 0o600)
    os.replace(folder / "agent-3.pem", path)  # agent 3's key where agent 2's should be
    with pytest.raises(IdentityError, match=r"agent-2.pem holds another key than the roster .* gives agent 2"):
        Identities(r, folder, [2])
    with pytest.raises(IdentityError, match=r"identity file .*agent-3.pem of agent 3 not found"):
        Identities(r, folder, [3])
    path.write_text("not a key")
    with pytest.raises(IdentityError, match="agent-2.pem of agent 2 is not an unencrypted PEM private key"):
        Identities(r, folder, [2])


def test_keys_generate_and_a_run_with_identities_from_the_cli(tmp_path):
    """As a user does it: `privdl keys generate`, then a sliced agreed run whose config names the roster and the
    identities relative to its own folder; the manifest states the mode and its threat model. The same config with
    a roster that lacks an agent stops with an error naming both."""
    runner = CliRunner()
    res = runner.invoke(app, ["keys", "generate", "--agents", "4", "--out", str(tmp_path / "ids")])
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE((tmp_path / "ids" / "identities" / "agent-0.pem").stat().st_mode) == 0o600
    cfg = tmp_path / "c.toml"
    cfg.write_text('name = "ids"\niterations = 4\n[network]\ntopology = "ring"\nn = 4\n[task]\nname = "logistic"\n'
                   'dataset = "breast_cancer"\n[mechanism]\nname = "decor"\nepsilon = 10.0\n[schedule]\neta = 0.1\n'
                   '[runtime]\nkeys = "agreed"\nbackend = "sliced"\nslices = 2\nidentity = "ed25519"\n'
                   'roster = "ids/roster.json"\nidentity_dir = "ids/identities"\n')
    res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "out"), "--no-plot", "--quiet"])
    assert res.exit_code == 0, res.output
    man = json.loads(next((tmp_path / "out" / "runs").rglob("manifest.json")).read_text())
    assert man["keys"]["identity"] == "ed25519" and "signed by its agent's Ed25519 identity" in \
        man["keys"]["threat_model"]
    data = json.loads((tmp_path / "ids" / "roster.json").read_text())
    del data["agents"]["3"]
    (tmp_path / "ids" / "roster.json").write_text(json.dumps(data))
    res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "out2"), "--no-plot", "--quiet"])
    said = " ".join(res.output.split())  # the console wraps long lines
    assert res.exit_code != 0 and "has no key for agent 3" in said and "roster.json has" in said
    bad = cfg.read_text().replace('keys = "agreed"\n', "")
    cfg.write_text(bad)
    res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "out3"), "--no-plot", "--quiet"])
    assert res.exit_code != 0 and "set runtime.keys" in " ".join(res.output.split())
