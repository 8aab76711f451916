"""The bad-input sweep of issue 16 (benchmarks/bad_inputs.py): every fixed key and every parameter of every
registered component, given values a user might mistype ("abc", "", -1, 0, 1e300, nan, -inf, true, [], [1, 2],
{a = 1}), run through ``privdl run``. None may end in a traceback, and none may end with nan metrics unless the
run's warning says so."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bad_inputs  # noqa: E402


@pytest.mark.parametrize("section", ["top", "network", "task", "algorithm", "mechanism", "schedule"])
def test_no_traceback_and_no_silent_nan_for_mistyped_values(tmp_path, section):
    found = []
    cases = bad_inputs.cases(section)
    assert len(cases) > 50 or section == "schedule", len(cases)
    for k, (label, cfg) in enumerate(cases):
        folder = tmp_path / str(k)
        folder.mkdir()
        outcome, text = bad_inputs.run_case(cfg, folder, timeout=120)
        if outcome in ("TRACEBACK", "ran-nonfinite", "slow"):
            found.append(f"{outcome} {label}: {text}")
    assert not found, "\n".join(found)


def test_the_sweep_tells_a_traceback_from_a_clear_error(tmp_path, monkeypatch):
    """The sweep itself must see a traceback when there is one (a sweep that cannot fail proves nothing)."""
    import privdl.tasks.quadratic as quadratic

    def broken(*args, **kwargs):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(quadratic, "quadratic_problem", broken)
    outcome, text = bad_inputs.run_case(bad_inputs.BASE, tmp_path)
    assert outcome == "TRACEBACK" and "planted" in text
    monkeypatch.undo()
    bad = bad_inputs.merged(bad_inputs.BASE, {"schedule": {"eta": "abc"}})
    (tmp_path / "b").mkdir()
    assert bad_inputs.run_case(bad, tmp_path / "b")[0] == "error"


def test_no_traceback_for_mistyped_options_of_the_fast_commands(tmp_path):
    """account, covariance and rms-bounds: every value option × "abc", "-1", "0", "1e300", "nan", "inf", ""
    (audit and reproduce train models: ``python benchmarks/bad_inputs.py --cli`` sweeps them)."""
    found = []
    for k, (label, argv) in enumerate(bad_inputs.cli_cases(bad_inputs.CLI_FAST)):
        folder = tmp_path / str(k)
        folder.mkdir()
        outcome, text = bad_inputs.run_cli_case(argv, folder, timeout=120)
        if outcome == "TRACEBACK" or (label.endswith("(base)") and outcome != "ran"):
            found.append(f"{outcome} {label}: {text}")
    assert not found, "\n".join(found)
