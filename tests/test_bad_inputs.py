"""The bad-input sweep of issues 16 and 29 (benchmarks/bad_inputs.py): every fixed key and every parameter of every
registered component, given values a user might mistype ("abc", "", -1, 0, 1e300, nan, -inf, true, [], [1, 2],
{a = 1}, and per the key's type a quoted number, a float for an integer, text for a boolean, another case of a
name, 5e-324, 2**63, …), run through ``privdl run``. None may end in a traceback or an unexplained exit, none may
end with nan metrics unless the run's warning says so, and no wrongly typed value may be accepted. Bad files and
folders given to every command that reads one must end in an error that names the file, or — where legitimate —
run and give the right result."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bad_files  # noqa: E402
import bad_inputs  # noqa: E402


def _failures(tmp_path, cases, run, failures) -> list[str]:
    """Run each case in a folder of its own; the ones whose outcome is among ``failures``, with what they printed."""
    found = []
    for k, case in enumerate(cases):
        folder = tmp_path / str(k)
        folder.mkdir()
        outcome, text = run(case, folder, timeout=120)
        if outcome in failures:
            found.append(f"{outcome} {case.label}: {text}")
    return found


@pytest.mark.slow
@pytest.mark.parametrize("section", ["top", "network", "task", "algorithm", "mechanism", "schedule"])
def test_no_traceback_and_no_silent_nan_for_mistyped_values(tmp_path, section):
    cases = bad_inputs.cases(section)
    assert len(cases) > 50 or section == "schedule", len(cases)
    assert any(c.mistyped for c in cases) and any(x in c.label for c in cases for x in ("5e-324", str(2**63)))
    found = _failures(tmp_path, cases, bad_inputs.run_case, bad_inputs.FAILURES)
    assert not found, "\n".join(found)


def test_values_are_mistyped_per_key_type():
    """An integer key gets a quoted number and a float, a float key quoted numbers and a subnormal, a boolean text,
    a name another case, a list a bare number (and each is marked as mistyped where its type is wrong)."""
    import typing

    from privdl.registry import one_of

    values = lambda annotation: {repr(v): bad for v, bad in bad_inputs.typed_values(annotation)}  # noqa: E731
    assert values(int) == {"'5'": True, "2.5": True, "10.0": True, repr(2**63): False}
    assert values(float | None) == {"'0.5'": True, "'1e-3'": True, "5e-324": False, "-0.0": False}
    assert values(bool) == {"'true'": True, "1": True, "'yes'": True}
    assert values(typing.Annotated[str, one_of("iid", "dirichlet")]) == {"'DIRICHLET'": True, "'dirichlet '": True}
    assert values(list[float] | None) == {"0.5": True, "['a', 'b']": True}
    assert values(int | str)["'5'"] is False  # text is a legal type there


@pytest.mark.slow
def test_the_sweep_tells_a_traceback_from_a_clear_error(tmp_path, monkeypatch):
    """The sweep itself must see a traceback, an unexplained exit ("Aborted."), an accepted value of the wrong type,
    an error that does not name its file and a bad file taken silently — a sweep that cannot fail proves nothing."""
    import privdl.experiment.config as config
    import privdl.experiment.config_resolve as config_resolve
    import privdl.network.network as network
    import privdl.tasks.quadratic as quadratic
    from privdl.errors import FileError, PrivdlError

    def broken(*args, **kwargs):
        raise ZeroDivisionError("planted")

    folders = iter(tmp_path / str(k) for k in range(100))

    def run(case):
        folder = next(folders)
        folder.mkdir()
        return bad_inputs.run_case(case, folder) if not isinstance(case, bad_files.FileCase) else \
            bad_files.run_file_case(case, folder)

    monkeypatch.setattr(quadratic, "quadratic_problem", broken)
    outcome, text = run(bad_inputs.BASE)
    assert outcome == "TRACEBACK" and "planted" in text
    monkeypatch.undo()
    assert run(bad_inputs.merged(bad_inputs.BASE, {"schedule": {"eta": "abc"}}))[0] == "error"

    def aborted(*args, **kwargs):
        raise EOFError()  # click turns it into a bare "Aborted."

    for planted, expected in ((aborted, "UNCLEAR"), (lambda *a, **k: (_ for _ in ()).throw(PrivdlError("")),
                                                     "UNCLEAR")):
        monkeypatch.setattr(config, "expand", planted)
        assert run(bad_inputs.BASE)[0] == expected
        monkeypatch.undo()

    quoted = bad_inputs.merged(bad_inputs.BASE, {"schedule": {"eta": "0.01"}})
    mistyped = bad_inputs.Case('schedule.eta = "0.01"', quoted, mistyped=True)
    assert run(mistyped)[0] == "error"
    monkeypatch.setattr(config_resolve, "_accepts", lambda annotation, value: True)  # a config reader that takes any type
    monkeypatch.setattr(bad_inputs, "to_toml", lambda cfg: bad_files.CONFIG)  # … and a value that still runs
    assert run(mistyped)[0] == "ran-mistyped"
    monkeypatch.undo()

    empty = next(c for c in bad_files.file_cases() if c.label == "W empty .npy")
    assert run(empty)[0] == "error"
    import privdl.data.files as files  # (every loader reads through it)

    monkeypatch.setattr(files, "read_matrix", lambda path, what: (_ for _ in ()).throw(FileError("it is empty")))
    assert run(empty)[0] == "UNNAMED"
    monkeypatch.setattr(files, "read_matrix", lambda path, what: __import__("numpy").array(bad_files._ring_w()))
    assert run(empty)[0] == "ACCEPTED"
    monkeypatch.undo()
    two_lines = next(c for c in bad_files.file_cases() if c.label.startswith("edge list of two lines (a path"))
    assert run(two_lines)[0] == "ran"
    import privdl.experiment.build as build

    monkeypatch.setattr(build, "load_network_file", lambda *a, **k: network.Network.from_topology("ring", 4))
    assert run(two_lines)[0] == "WRONG"  # a silent wrong result: 4 agents where the file has 3


@pytest.mark.slow
def test_bad_files_and_folders_end_in_an_error_that_names_the_file(tmp_path):
    """Every case of the sweep's file section: configs in other encodings, W and R files, edge lists, network
    files of a config, manifests, experiment.json, metrics.csv and results.csv that are empty, cut short,
    mis-encoded or of another kind, and --out places that cannot be written — and the legitimate variants (a BOM,
    UTF-16, a two-line edge list) run with the right result."""
    cases = bad_files.file_cases()
    assert len(cases) >= 100 and sum(bool(c.names) for c in cases) >= 80
    found = _failures(tmp_path, cases, bad_files.run_file_case, bad_files.FILE_FAILURES)
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_no_traceback_for_mistyped_options_of_the_fast_commands(tmp_path):
    """account, covariance and rms-bounds: every value option × "abc", "-1", "0", "1e300", "nan", "inf", ""
    (audit and reproduce train models: ``python benchmarks/bad_inputs.py --cli`` sweeps them)."""
    found = []
    for k, (label, argv) in enumerate(bad_inputs.cli_cases(bad_inputs.CLI_FAST)):
        folder = tmp_path / str(k)
        folder.mkdir()
        outcome, text = bad_inputs.run_cli_case(argv, folder, timeout=120)
        if outcome in ("TRACEBACK", "UNCLEAR") or (label.endswith("(base)") and outcome != "ran"):
            found.append(f"{outcome} {label}: {text}")
    assert not found, "\n".join(found)
