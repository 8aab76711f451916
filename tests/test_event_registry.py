"""Privacy event types are a public registry (issue 45, items 4 and 5): a user's own frozen-dataclass event,
registered with ``register_event``, is stored in a ledger, re-accounted and verified through the path
``privdl account --manifest`` takes, and held to the same field checks as the built-in kinds; a second class under
one kind is refused naming both; the ledger's JSON form carries a schema version, and ledgers written before it
(no version) still re-account."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import ClassVar

import dp_accounting
import pytest
from typer.testing import CliRunner

from privdl.cli import app
from privdl.errors import ValidationError
from privdl.privacy import EVENTS, GaussianEvent, Ledger, register_event
from privdl.privacy.accountants import ACCOUNTANTS
from privdl.privacy.ledger import LEDGER_SCHEMA
from privdl.privacy.verify import LedgerFieldError, LedgerMismatch, verify_ledger


@register_event
@dataclass(frozen=True)
class ScaledGaussianEvent:
    """A user's parametrisation of the Gaussian mechanism: noise std ``sigma`` on a query of L2 sensitivity Δ
    (noise multiplier σ/Δ)."""

    sigma: float
    sensitivity: float
    count: int = 1
    kind: ClassVar[str] = "tests.scaled_gaussian"

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(self.sigma / self.sensitivity),
                                                 self.count)


@register_event
@dataclass(frozen=True)
class SecretSharingEvent:
    """A user's mechanism that claims no DP guarantee."""

    parties: int
    count: int = 1
    kind: ClassVar[str] = "tests.secret_sharing"

    def to_dp_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.UnsupportedDpEvent()


def _user_ledger(accountant: str) -> Ledger:
    return Ledger.build(unit="agent", mechanism="scaled", accountant=accountant, delta=1e-5,
                        events=[[ScaledGaussianEvent(sigma=2.0, sensitivity=1.0, count=c)] for c in (30, 50, 40)])


def _manifest(tmp_path, ledger: dict):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"privacy_ledger": [ledger]}))
    return path


def account(path) -> object:
    return CliRunner().invoke(app, ["account", "--manifest", str(path), "--format", "json"])


def test_the_registry_is_public_and_holds_the_built_in_kinds():
    assert {"gaussian", "subsampled_gaussian", "pure_laplace", "obfuscation", "laplace", "non_private",
            "tests.scaled_gaussian"} <= set(EVENTS.names())
    assert EVENTS.get("gaussian") is GaussianEvent and EVENTS.get("tests.scaled_gaussian") is ScaledGaussianEvent
    import privdl.privacy.events as events

    assert not hasattr(events, "EVENT_TYPES")  # no private dict to edit


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_a_user_event_accounts_like_the_dp_event_it_stands_for(accountant):
    """σ = 2 on Δ = 1 is the built-in Gaussian event of noise multiplier 2 (precision 1/4): the same ε, bit for bit."""
    acc = ACCOUNTANTS.get(accountant)
    assert acc.supports(ScaledGaussianEvent(2.0, 1.0)) and not acc.supports(SecretSharingEvent(3))
    mine = _user_ledger(accountant)
    builtin = Ledger.build(unit="agent", mechanism="g", accountant=accountant, delta=1e-5,
                           events=[[GaussianEvent(precision=0.25, sensitivity=1.0, count=c)] for c in (30, 50, 40)])
    assert mine.epsilons == builtin.epsilons and all(0 < e < math.inf for e in mine.epsilons)


def test_a_user_event_re_accounts_and_verifies_from_its_manifest(tmp_path):
    led = _user_ledger("pld")
    stated = json.loads(json.dumps(led.to_dict()))
    assert verify_ledger(stated).epsilons == led.epsilons  # privdl.privacy.verify, from Python
    res = account(_manifest(tmp_path, stated))  # the command's code path
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["verified"] is True and out["epsilon"] == stated["epsilon"] == max(led.epsilons)
    assert [r["epsilon"] for r in out["per_agent"]] == led.epsilons


def test_an_edited_user_event_is_refused_naming_its_agent(tmp_path):
    stated = _user_ledger("pld").to_dict()
    stated["per_agent"][1]["events"][0]["sigma"] = 2.5
    res = account(_manifest(tmp_path, stated))
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "per_agent[1].epsilon" in text and "(tests.scaled_gaussian)" in text, text
    with pytest.raises(LedgerMismatch, match=r"per_agent\[1\]\.epsilon"):
        verify_ledger(json.loads(json.dumps(stated)))


@pytest.mark.parametrize("field,value,words", [
    ("sigma", -2.0, "finite number > 0"), ("sigma", "2", "must be a number"), ("count", 0, "integer >= 1"),
    ("noise", 1.0, "has no field 'noise'"),
])
def test_a_user_events_fields_are_checked_by_their_declared_types(field, value, words):
    stated = _user_ledger("rdp").to_dict()
    stated["per_agent"][2]["events"][0][field] = value
    with pytest.raises(LedgerFieldError, match="privacy_ledger\\[0\\].per_agent\\[2\\].events\\[0\\]") as err:
        verify_ledger(stated)
    assert words in str(err.value)


def test_a_user_event_without_a_guarantee_has_no_epsilon():
    led = Ledger.build(unit="agent", mechanism="mpc", accountant="pld", delta=1e-5,
                       events=[[SecretSharingEvent(parties=3, count=4)], []])
    assert led.epsilons == [None, 0.0] and led.epsilon is None and "no DP guarantee" in led.guarantee
    assert verify_ledger(json.loads(json.dumps(led.to_dict()))).epsilons == [None, 0.0]


def test_an_unregistered_kind_in_a_manifest_is_named(tmp_path):
    stated = _user_ledger("pld").to_dict()
    stated["per_agent"][0]["events"][0]["kind"] = "tests.never_registered"
    res = account(_manifest(tmp_path, stated))
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "privacy_ledger[0].per_agent[0].events[0].kind" in text
    assert "'tests.never_registered'" in text and "import the module that registers it" in text


def test_a_second_class_under_a_registered_kind_is_refused_naming_both():
    @dataclass(frozen=True)
    class Impostor:
        precision: float
        count: int = 1
        kind: ClassVar[str] = "gaussian"

        def to_dp_event(self) -> dp_accounting.DpEvent:
            return dp_accounting.NonPrivateDpEvent()

    with pytest.raises(ValidationError, match="registered twice") as err:
        register_event(Impostor)
    assert "privdl.privacy.events.GaussianEvent" in str(err.value) and "Impostor" in str(err.value)
    assert EVENTS.get("gaussian") is GaussianEvent
    with pytest.raises(ValidationError, match="tests.scaled_gaussian.*registered twice"):
        register_event(dataclass(frozen=True)(type("Again", (), {"__annotations__": {"count": "int"}, "count": 1,
                                                                 "kind": "tests.scaled_gaussian",
                                                                 "to_dp_event": lambda self: None})))


def _candidate(**changes):
    """A well-formed event class but for ``changes`` (frozen, kind, count, to_dp_event, a field's type)."""
    annotations = {"scale": changes.pop("scale_type", "float")}
    if changes.pop("count", True):
        annotations["count"] = "int"
    body = {"__annotations__": annotations, "count": 1, "__module__": __name__}
    if "kind" in changes:
        if changes["kind"] is not None:
            body["kind"] = changes["kind"]
    else:
        body["kind"] = "tests.candidate"
    if changes.pop("method", True):
        body["to_dp_event"] = lambda self: dp_accounting.NoOpDpEvent()
    if not annotations.get("count"):
        body.pop("count")
    cls = type("Candidate", (), body)
    return dataclass(frozen=changes.pop("frozen", True))(cls)


@pytest.mark.parametrize("changes,words", [
    ({"frozen": False}, "must be a frozen dataclass"),
    ({"kind": None}, "needs a class variable kind"),
    ({"kind": ""}, "needs a class variable kind"),
    ({"count": False}, "needs a field count"),
    ({"method": False}, "needs a method to_dp_event"),
    ({"scale_type": "list"}, "field scale: list is not one of float, int, str, bool"),
])
def test_an_event_type_outside_the_protocol_is_refused_naming_the_class(changes, words):
    with pytest.raises(ValidationError, match=words) as err:
        register_event(_candidate(**changes))
    assert "Candidate" in str(err.value)
    assert "tests.candidate" not in EVENTS
    with pytest.raises(ValidationError, match="not a dataclass"):
        register_event(type("Plain", (), {"kind": "tests.plain"}))


# ---- the ledger's schema version ------------------------------------------------------------------------------------
def test_a_ledger_states_its_schema_and_one_without_is_read_as_the_first(tmp_path):
    stated = _user_ledger("rdp").to_dict()
    assert stated["schema"] == LEDGER_SCHEMA == 1
    older = {k: v for k, v in stated.items() if k != "schema"}  # a manifest written before the version
    res = account(_manifest(tmp_path, older))
    assert res.exit_code == 0 and json.loads(res.output)["epsilon"] == stated["epsilon"], res.output


@pytest.mark.parametrize("schema,words", [(LEDGER_SCHEMA + 1, "written by a newer privdl"),
                                          ("1", "a ledger schema version"), (0, "a ledger schema version")])
def test_a_ledger_of_a_schema_this_privdl_cannot_read_is_refused(tmp_path, schema, words):
    stated = _user_ledger("rdp").to_dict()
    stated["schema"] = schema
    res = account(_manifest(tmp_path, stated))
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "privacy_ledger[0].schema" in text and words in text, text
    if schema == LEDGER_SCHEMA + 1:
        assert f"schema {LEDGER_SCHEMA + 1}" in text and f"reads schema {LEDGER_SCHEMA}" in text
    with pytest.raises(ValueError, match=words):
        Ledger.from_dict(stated)
