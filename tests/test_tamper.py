"""Tamper-evident ledgers and one default accountant (issue 29).

``privdl account --manifest`` re-accounts a finished run and compares with every number its ledger states: an
untouched manifest from a real run re-accounts to exactly its stated ε (the same library: bit for bit), and each
kind of hand edit — a count, a precision, a sensitivity, a noise multiplier, a sample rate, δ, a stated ε, in the
ledger or in a statement beside it — is an error naming the field by its JSON path, never a new number; NaN,
negative, non-numeric and missing fields are refused with their path. ``privdl account`` and ``privdl covariance``
calibrate with the same default accountant (the library's), and every output names the accountant it used.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from privdl.cli import app
from tests.test_ledger import CONFIG as LEDGER_RUNS

ROOT = Path(__file__).resolve().parents[1]

#: tests/test_ledger.py's runs — DP-SGD (four data sizes, four rates; a given σ, so that no calibration costs
#: seconds here: the ledger is the same kind), Whisper with the paper accountant, non-private — and per-example
#: clipping of LDP noise (an agent-level statement beside the example-level one)
CALIBRATED = "epsilon = 2.0, delta = 1e-5, clip = 1.0, lot_size = 20"
assert LEDGER_RUNS.count(CALIBRATED) == 1
RUNS = LEDGER_RUNS.replace(CALIBRATED, "noise_multiplier = 1.3, delta = 1e-5, clip = 1.0, lot_size = 20") + """
[[sweep.privacy]]
label = "per_example"
mechanism = { name = "ldp", epsilon = 3.0, delta = 1e-5, clip = 0.5, clipping = "per_example" }
"""


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    """Manifests written by the runner: the quickstart (examples/quickstart.toml cut to 10 rounds, one seed, one ε:
    gaussian_ldp with the tight accountant and non-private runs, on both of its tasks) and RUNS."""
    from privdl.experiment import load_config, run_experiment

    root = tmp_path_factory.mktemp("tamper")
    quick = (ROOT / "examples" / "quickstart.toml").read_text()
    for pattern, value in ((r"(?m)^iterations = \d+", "iterations = 10"), (r"(?m)^seeds = \[[^\]]*\]", "seeds = [0]"),
                           (r'(?m)^"mechanism.epsilon" = \[[^\]]*\]', '"mechanism.epsilon" = [10.0]')):
        quick, k = re.subn(pattern, value, quick)
        assert k == 1, pattern
    (root / "quickstart.toml").write_text(quick)
    (root / "runs.toml").write_text(RUNS)
    found = {}
    for name in ("quickstart", "runs"):
        run_experiment(load_config(root / f"{name}.toml"), root / name, progress=False)
        for path in (root / name / "runs").glob("*/manifest.json"):
            man = json.loads(path.read_text())
            sweep = man["sweep"]
            label = sweep.get("privacy") or f"{sweep['mechanism.name']}-{sweep['task']}"
            found[label] = path
    assert {"dp_sgd", "whisper", "per_example", "gaussian_ldp-logistic", "none-quadratic"} <= set(found)
    return found


def account(path: Path, *extra: str):
    return CliRunner().invoke(app, ["account", "--manifest", str(path), *extra])


@pytest.mark.parametrize("label", ["gaussian_ldp-logistic", "gaussian_ldp-quadratic", "none-logistic", "dp_sgd",
                                   "whisper", "per_example"])
def test_an_untouched_manifest_re_accounts_to_exactly_its_stated_epsilon(manifests, label):
    stated = json.loads(manifests[label].read_text())["privacy_ledger"][0]
    res = account(manifests[label], "--format", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["verified"] is True and out["accountant"] == stated["accountant"]
    assert out["epsilon"] == stated["epsilon"]  # deterministic: the same events, the same library, the same bits
    assert [r["epsilon"] for r in out["per_agent"]] == [r["epsilon"] for r in stated["per_agent"]]
    for b in stated.get("beside", []):
        assert out[f"{b['unit']}_level_epsilon"] == b["epsilon"]
    table = account(manifests[label])
    named = "(no DP accountant" if stated["accountant"] == "none" else f"({stated['accountant']} accountant"
    assert table.exit_code == 0 and named in " ".join(table.output.split())


def test_a_committed_manifest_of_an_earlier_release_re_accounts_cleanly():
    """A manifest written months ago by the seed-004 reproduction (10 agents, DP-SGD, RDP) passes every check."""
    path, stated = next((p, led) for p in sorted((ROOT / "docs" / "reproduction" / "seed004").rglob("manifest.json"))
                        for led in json.loads(p.read_text())["privacy_ledger"]
                        if led["mechanism"] == "dp_sgd" and len(led["per_agent"]) == 10)
    res = account(path, "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["epsilon"] == stated["epsilon"]


def _scale(v: float) -> float:
    return v * 1.01


#: (run, JSON path of the edited field, how it is edited, the path the error must name). Every field an ε is computed
#: from, in every kind of event a ledger holds, and the stated numbers themselves.
EDITS = [
    ("dp_sgd", "per_agent[2].events[0].count", lambda v: v + 1, "per_agent[2].events[0].count"),
    ("dp_sgd", "per_agent[1].events[0].sample_rate", _scale, "per_agent[1].events[0].sample_rate"),
    ("dp_sgd", "per_agent[3].events[0].noise_multiplier", _scale, "per_agent[3].events[0].noise_multiplier"),
    ("whisper", "per_agent[0].events[0].precision", _scale, "per_agent[0].events[0].precision"),
    ("whisper", "per_agent[2].events[0].sensitivity", _scale, "per_agent[2].events[0].sensitivity"),
    ("gaussian_ldp-logistic", "per_agent[7].events[0].precision", _scale, "per_agent[7].events[0].precision"),
    ("gaussian_ldp-logistic", "delta", lambda v: v * 10, "privacy_ledger[0].delta"),
    ("dp_sgd", "per_agent[1].delta", lambda v: v * 10, "per_agent[1].delta"),
    ("dp_sgd", "per_agent[2].epsilon", lambda v: v * 0.9, "per_agent[2].epsilon"),
    ("whisper", "epsilon", lambda v: v * 0.9, "privacy_ledger[0].epsilon"),
    ("none-logistic", "per_agent[4].events[0].count", lambda v: v + 5, "per_agent[4].events[0].count"),
    ("per_example", "beside[0].per_agent[1].events[0].sensitivity", _scale,
     "beside[0].per_agent[1].events[0]: events[0] (gaussian) gives noise_multiplier"),
    ("per_example", "beside[0].epsilon", lambda v: v * 0.9, "privacy_ledger[0].beside[0].epsilon"),
]


def _at(data: dict, path: str) -> tuple[object, str | int]:
    """The container of the field at a JSON path like ``per_agent[2].events[0].count``, and its key."""
    keys: list[str | int] = []
    for part in path.split("."):
        name, *idx = re.split(r"\[|\]\[|\]", part.rstrip("]")) if "[" in part else [part]
        keys.append(name)
        keys.extend(int(i) for i in idx if i)
    for k in keys[:-1]:
        data = data[k]  # type: ignore[index]
    return data, keys[-1]


def edited(path: Path, tmp_path: Path, field: str, change) -> Path:
    man = json.loads(path.read_text())
    holder, key = _at(man["privacy_ledger"][0], field)
    holder[key] = change(holder[key])  # type: ignore[index]
    out = tmp_path / "manifest.json"
    out.write_text(json.dumps(man))
    return out


def refused(res, path: str) -> str:
    """The command failed (exit 2), named ``path`` and printed no result."""
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert path in text, text
    assert '"epsilon"' not in res.output  # no JSON result, no quiet new number
    return text


@pytest.mark.parametrize("label,field,change,named", EDITS, ids=[f"{e[0]}:{e[1]}" for e in EDITS])
def test_a_hand_edit_is_an_error_that_names_the_field(manifests, tmp_path, label, field, change, named):
    res = account(edited(manifests[label], tmp_path, field, change), "--format", "json")
    refused(res, named)


def test_an_event_edited_together_with_its_row_is_named_by_its_agent_and_events(manifests, tmp_path):
    """A count and the row's accesses edited alike: the summaries agree, the re-accounted ε tells — the error names
    the agent's ε and its event."""
    path = edited(manifests["dp_sgd"], tmp_path, "per_agent[2].events[0].count", lambda v: v + 1)
    path = edited(path, tmp_path, "per_agent[2].accesses", lambda v: v + 1)
    text = refused(account(path), "per_agent[2].epsilon")
    assert "events[0] (subsampled_gaussian)" in text


def test_delta_edited_everywhere_is_named(manifests, tmp_path):
    path = edited(manifests["whisper"], tmp_path, "delta", lambda v: 1e-6)
    for i in range(4):
        path = edited(path, tmp_path, f"per_agent[{i}].delta", lambda v: 1e-6)
    text = refused(account(path), "privacy_ledger[0].delta")
    assert "every agent's ε differs" in text


def test_another_accountant_named_by_hand_is_refused(manifests, tmp_path):
    path = edited(manifests["whisper"], tmp_path, "accountant", lambda v: "tight")  # the noise was paper-calibrated
    refused(account(path), "privacy_ledger[0].delta")  # every agent differs: δ or the accountant


#: (field, bad value, expected words): NaN, negative, non-numeric, boolean, missing, unknown
BAD = [
    ("per_agent[3].events[0].count", math.nan, "must be a number"),
    ("per_agent[3].events[0].count", -3, "integer >= 1"),
    ("per_agent[3].events[0].count", 2.5, "integer >= 1"),
    ("per_agent[1].events[0].noise_multiplier", -1.3, "finite number > 0"),
    ("per_agent[1].events[0].noise_multiplier", "1.3", "must be a number"),
    ("per_agent[0].events[0].sample_rate", 1.5, "sample rate in (0, 1]"),
    ("per_agent[0].events[0].sample_rate", True, "must be a number"),
    ("per_agent[2].epsilon", math.nan, "must be a number"),
    ("per_agent[2].epsilon", -1.0, ">= 0"),
    ("delta", "1e-5", "must be a number"),
    ("noise.clip", math.nan, "NaN is never a ledger value"),
]


@pytest.mark.parametrize("field,value,words", BAD, ids=[f"{b[0]}={b[1]!r}" for b in BAD])
def test_a_bad_value_is_refused_with_its_json_path(manifests, tmp_path, field, value, words):
    path = edited(manifests["dp_sgd"], tmp_path, field, lambda v: value)
    text = refused(account(path), f"privacy_ledger[0].{field}")
    assert words in text


def test_missing_and_unknown_event_fields_are_refused(manifests, tmp_path):
    man = json.loads(manifests["dp_sgd"].read_text())
    del man["privacy_ledger"][0]["per_agent"][1]["events"][0]["count"]  # would default to 1 access
    (tmp_path / "m.json").write_text(json.dumps(man))
    refused(account(tmp_path / "m.json"), "privacy_ledger[0].per_agent[1].events[0].count is missing")
    man = json.loads(manifests["dp_sgd"].read_text())
    man["privacy_ledger"][0]["per_agent"][1]["events"][0]["clip"] = 1.0
    (tmp_path / "m.json").write_text(json.dumps(man))
    refused(account(tmp_path / "m.json"), "privacy_ledger[0].per_agent[1].events[0].clip")


# ---- one default accountant, named in every output ------------------------------------------------------------------
def test_account_and_covariance_calibrate_with_the_librarys_default_accountant():
    """Without --accountant both commands give the same b for the same (ε, δ, C, T): the bound of the library's
    default accountant (the one mechanisms calibrate with), which is the tight one; both name it."""
    from privdl.mechanisms.correlated import CorrelatedGaussian
    from privdl.privacy import get_accountant
    from privdl.privacy.accountants import DEFAULT_AGENT_ACCOUNTANT

    assert DEFAULT_AGENT_ACCOUNTANT == "tight"
    assert inspect.signature(CorrelatedGaussian).parameters["accountant"].default == DEFAULT_AGENT_ACCOUNTANT
    budget = ["--epsilon", "3", "--delta", "1e-5", "--clip", "0.1", "--steps", "500", "--format", "json"]
    acc = CliRunner().invoke(app, ["account", *budget])
    cov = CliRunner().invoke(app, ["covariance", "--topology", "ring", "--n", "6", "--design", "ldp", *budget])
    assert acc.exit_code == 0 and cov.exit_code == 0, acc.output + cov.output
    a, c = json.loads(acc.output), json.loads(cov.output)
    assert a["accountant"] == c["accountant"] == DEFAULT_AGENT_ACCOUNTANT
    b = get_accountant(DEFAULT_AGENT_ACCOUNTANT).bound(epsilon=3, delta=1e-5, clip=0.1, steps=500)
    assert a["bound"] == c["bound"] == b
    assert "tight accountant" in c["guarantee"]


@pytest.mark.parametrize("command", ["account", "covariance"])
def test_the_paper_accountant_stays_available_and_is_named(command):
    """--accountant paper gives Theorem 2's exact inverse b = (√(L+ε) − √L)²/(2TC²), computed here, and says so in
    the JSON and the table's title."""
    budget = ["--epsilon", "3", "--delta", "1e-5", "--clip", "0.1", "--steps", "500", "--accountant", "paper"]
    where = ["--topology", "ring", "--n", "6", "--design", "ldp"] if command == "covariance" else []
    res = CliRunner().invoke(app, [command, *where, *budget, "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    L = math.log(1e5)
    assert out["accountant"] == "paper"
    assert out["bound"] == pytest.approx((math.sqrt(L + 3) - math.sqrt(L)) ** 2 / (2 * 500 * 0.1**2), rel=1e-9)
    table = CliRunner().invoke(app, [command, *where, *budget])
    assert table.exit_code == 0 and "(paper accountant)" in " ".join(table.output.split())


@pytest.mark.parametrize("named", [None, "pld", "rdp"])
def test_example_level_accounting_names_its_accountant(named):
    """Without --accountant the example level uses the library's default for new configs (PLD), and says so."""
    from privdl.cli.privacy import DEFAULT_EXAMPLE_ACCOUNTANT
    from privdl.privacy.example_accountant import DEFAULT_EXAMPLE_ACCOUNTANT as LIBRARY

    assert DEFAULT_EXAMPLE_ACCOUNTANT.value == LIBRARY == "pld"
    args = ["account", "--unit", "example", "--noise-multiplier", "1.5", "--sample-rate", "0.04", "--steps", "100",
            *(["--accountant", named] if named else [])]
    res = CliRunner().invoke(app, args)
    want = named or LIBRARY
    assert res.exit_code == 0 and f"({want} accountant" in " ".join(res.output.split())
    assert json.loads(CliRunner().invoke(app, [*args, "--format", "json"]).output)["accountant"] == want
