"""Pure DP (δ = 0) is re-accounted and verified (issue 45, item 4): the Laplace mechanism with a sensitivity bound
(``PureLaplaceEvent``, ε₀ = Δ/b per release) composes to count·Δ/b at δ = 0 — the closed form, whichever
accountant takes the events — and to a smaller ε at δ > 0 (PLD, checked with dp_accounting directly); a ledger at
δ = 0 goes through ``privdl account --manifest`` like any other, and a tampered one is refused. δ = 0 was read as
"no DP" or refused in three places (the accountants, the ledger's field checks, a chain's DP member): each is tested
here."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
import torch
from typer.testing import CliRunner

from privdl.cli import app
from privdl.errors import ValidationError
from privdl.mechanisms.base import Clip, GradientMechanism, Sensitivity, chain
from privdl.privacy import GaussianEvent, Ledger, LaplaceEvent, PureLaplaceEvent
from privdl.privacy.accountants import ACCOUNTANTS
from privdl.privacy.events import pure_epsilon
from privdl.privacy.verify import LedgerFieldError, verify_ledger

#: (scale b, L1 sensitivity Δ, releases per agent)
B, SENS, COUNTS = 0.7, 0.3, (40, 25, 0, 33)


def basic(count: int, *, scale: float = B, sensitivity: float = SENS) -> float:
    """count·Δ/b: basic composition of ``count`` (Δ/b)-DP releases (Dwork & Roth 2014, Thm. 3.16)."""
    return count * sensitivity / scale


def _events() -> list[list[PureLaplaceEvent]]:
    return [[PureLaplaceEvent(scale=B, sensitivity=SENS, count=c)] if c else [] for c in COUNTS]


def _ledger(accountant: str = "pld", delta: float = 0.0) -> Ledger:
    return Ledger.build(unit="agent", mechanism="laplace", accountant=accountant, delta=delta, events=_events(),
                        noise={"scale": B, "sensitivity": SENS})


def account(tmp_path, ledger: dict):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"privacy_ledger": [ledger]}))
    return CliRunner().invoke(app, ["account", "--manifest", str(path), "--format", "json"])


def test_a_laplace_release_is_pure_and_maps_to_dp_accountings_laplace_event():
    e = PureLaplaceEvent(scale=2.0, sensitivity=0.5, count=3)
    assert e.epsilon == 0.25 and e.noise_multiplier == 4.0 and pure_epsilon(e) == 0.75
    assert e.to_dp_event() == dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(4.0), 3)
    assert pure_epsilon(GaussianEvent(precision=1.0, sensitivity=1.0)) is None
    assert pure_epsilon(LaplaceEvent("pd_lms", 1.0)) is None  # no sensitivity bound: no ε at all
    for name in ("rdp", "pld"):
        assert ACCOUNTANTS.get(name).supports(e) and not ACCOUNTANTS.get(name).supports(LaplaceEvent("x", 1.0))
    for name in ("tight", "paper"):
        assert not ACCOUNTANTS.get(name).supports(e)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_at_delta_zero_every_accountant_states_the_basic_composition(accountant):
    led = _ledger(accountant)
    want = [basic(c) for c in COUNTS]
    assert led.epsilons == pytest.approx(want, rel=1e-14, abs=0)
    assert led.epsilon == pytest.approx(basic(max(COUNTS)), rel=1e-14) and led.delta == 0.0
    assert led.guarantee.startswith(f"({basic(max(COUNTS)):.6g}, 0)-DP per agent")
    # two kinds of pure event on one agent add up
    two = [PureLaplaceEvent(scale=B, sensitivity=SENS, count=4), PureLaplaceEvent(scale=2.0, sensitivity=1.0, count=6)]
    assert ACCOUNTANTS.get(accountant).account(two, delta=0.0) == pytest.approx(basic(4) + 6 * 0.5, rel=1e-14)


def test_with_delta_the_pld_gives_at_most_the_basic_composition():
    """At δ > 0 the PLD of the Laplace mechanism (dp_accounting directly, and the ledger's adaptive PLD) is below
    count·Δ/b — well below, for many releases."""
    for delta in (1e-5, 1e-3):
        direct = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
        direct.compose(dp_accounting.LaplaceDpEvent(B / SENS), 40)
        eps = direct.get_epsilon(delta)
        assert 0 < eps <= basic(40)
        led = _ledger("pld", delta)
        assert led.epsilons[0] <= basic(40) and led.epsilons[0] == pytest.approx(eps, rel=2e-3)
        assert all(e <= basic(c) for e, c in zip(led.epsilons, COUNTS))
    assert _ledger("pld", 1e-5).epsilons[0] < 0.8 * basic(40)


def test_at_delta_zero_a_non_pure_event_is_refused_naming_its_kind():
    for name in ("pld", "rdp"):
        with pytest.raises(ValidationError, match="a gaussian event is not pure DP"):
            Ledger.build(unit="agent", mechanism="g", accountant=name, delta=0.0,
                         events=[[GaussianEvent(precision=1.0, sensitivity=1.0, count=3)]])
    with pytest.raises(ValidationError, match="delta must be in"):
        Ledger.build(unit="agent", mechanism="g", accountant="tight", delta=0.0,
                     events=[[GaussianEvent(precision=1.0, sensitivity=1.0, count=3)]])


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_a_pure_dp_manifest_re_accounts_to_the_closed_form(tmp_path, accountant):
    stated = json.loads(json.dumps(_ledger(accountant).to_dict()))
    assert stated["delta"] == 0.0 and verify_ledger(stated).epsilon == stated["epsilon"]
    res = account(tmp_path, stated)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["verified"] is True and out["delta"] == 0.0 and out["epsilon"] == stated["epsilon"]
    assert [r["epsilon"] for r in out["per_agent"]] == pytest.approx([basic(c) for c in COUNTS], rel=1e-14, abs=0)


def _edit(stated: dict, change) -> dict:
    data = json.loads(json.dumps(stated))
    change(data)
    return data


def _gaussian_in(data: dict) -> None:
    """Agent 1's Laplace event replaced by a Gaussian one with the same count (its row still agrees)."""
    data["per_agent"][1]["events"][0] = {"kind": "gaussian", "precision": 1.0, "sensitivity": 1.0, "count": 25}


#: (how the manifest is edited, the path the refusal names, words)
TAMPERED = [
    (lambda d: d["per_agent"][0]["events"][0].update(scale=0.8), "per_agent[0].epsilon", "(pure_laplace)"),
    (lambda d: d["per_agent"][3]["events"][0].update(sensitivity=0.6), "per_agent[3].epsilon", "re-account"),
    (lambda d: d["per_agent"][1]["events"][0].update(count=26), "per_agent[1].events[0].count", "accesses"),
    (lambda d: d.update(epsilon=d["epsilon"] * 0.9), "privacy_ledger[0].epsilon", "re-account"),
    (lambda d: [d.update(delta=1e-5), *(r.update(delta=1e-5) for r in d["per_agent"])], "privacy_ledger[0].delta",
     "every agent's ε differs"),
    (_gaussian_in, "privacy_ledger[0].delta = 0 states pure DP", "per_agent[1].events[0] (gaussian) is not a pure-DP"),
    (lambda d: d["per_agent"][2].update(epsilon=1.0), "per_agent[2].epsilon", "re-account"),
]


@pytest.mark.parametrize("change,path,words", TAMPERED, ids=[t[1] for t in TAMPERED])
def test_a_tampered_pure_dp_manifest_is_refused(tmp_path, change, path, words):
    res = account(tmp_path, _edit(_ledger("pld").to_dict(), change))
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and path in text and words in text, text
    assert '"epsilon"' not in res.output


def test_a_finite_epsilon_at_delta_zero_over_gaussian_events_is_a_field_error():
    led = Ledger.build(unit="agent", mechanism="g", accountant="pld", delta=1e-5,
                       events=[[GaussianEvent(precision=1.0, sensitivity=1.0, count=3)]])
    data = _edit(led.to_dict(), lambda d: [d.update(delta=0.0), d["per_agent"][0].update(delta=0.0)])
    with pytest.raises(LedgerFieldError, match=r"delta = 0 states pure DP.*per_agent\[0\]\.events\[0\] \(gaussian\)"):
        verify_ledger(data)


class _LaplaceNoise(GradientMechanism):
    """A pure-DP mechanism for this test: Laplace noise of scale b on its input, whose sensitivity (given by the clip
    before it) it reads as an L1 bound. Its δ is 0."""

    name = "test_laplace"
    accountant_name = "pld"
    delta = 0.0

    def __init__(self, *, steps: int, scale: float) -> None:
        super().__init__(steps=steps)
        self.scale = scale

    def privatize(self, value: torch.Tensor, access) -> torch.Tensor:
        return value + torch.distributions.Laplace(0.0, self.scale).sample(value.shape).to(value.dtype)

    def step_events(self, before: Sensitivity | None):
        return [PureLaplaceEvent(scale=self.scale, sensitivity=before.value)], before


def test_a_chain_takes_its_accountant_from_the_member_that_adds_noise_even_at_delta_zero():
    """A chain's DP member was the one with δ > 0: a pure-DP member (δ = 0) left the chain with no accountant."""
    mech = chain(Clip(steps=5, clip=1.0), _LaplaceNoise(steps=5, scale=4.0))
    assert mech.accountant_name == "pld" and mech.delta == 0.0
    led = mech.ledger(torch.tensor([5, 5, 3]))
    assert led.accountant == "pld" and led.unit == "agent" and led.delta == 0.0
    assert led.epsilons == pytest.approx([5 * 2.0 / 4.0, 5 * 2.0 / 4.0, 3 * 2.0 / 4.0], rel=1e-14)
    assert verify_ledger(json.loads(json.dumps(led.to_dict()))).epsilon == led.epsilon
    assert math.isfinite(led.epsilon)
