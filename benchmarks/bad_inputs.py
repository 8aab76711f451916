"""Bad-input sweep (issues 16 and 29): every parameter of every registered component, and every fixed key, given
values a user might mistype, each run through ``privdl run`` in this process; and bad files and folders given to
every command that reads one. The contract is: **no traceback** — every input ends in a clear error (a non-zero
exit whose message explains: "error: …" or a usage error, never a bare "Aborted." or an empty message) or a finished
run — and **no silent nan**: a legal value whose run overflows (``curvature = 1e300``) must end with the warning that
names the non-finite metrics ("ran-flagged").

Values are typed the way a user mistypes them for the key's type: besides the generic ones ("abc", "", -1, 0,
1e300, nan, -inf, true, [], [1, 2], {a = 1}), an integer key gets "5" (quoted), 2.5, 10.0 and 2**63; a float key
"0.5" and "1e-3" (quoted), 5e-324 and -0.0; a boolean "true" (quoted), 1 and "yes"; a name another case or a
trailing space; a list a bare number and a list of text. A wrongly typed value that is accepted and runs is
"ran-mistyped" (it would run as something the user did not mean).

Files and folders (``--files``): configs in other encodings (UTF-8 with a byte-order mark and UTF-16 run; Latin-1,
binary junk, a .npy, JSON, cut short do not), W and R matrices and edge lists (empty, cut short, objects, complex,
1-d, .npz, nan, ragged, a header, directed, an edge list where W belongs, numbered from 1), network files of a
config, manifests, experiment.json, metrics.csv and results.csv (empty, cut short, junk, another JSON kind), and
``--out`` places (a file, through a file, read-only, a foreign folder). Each must end in a clear error that names the
file ("error"), or — where the input is legitimate — run and give the right result ("ran"). "UNNAMED" (an error that
does not name the file), "UNCLEAR", "TRACEBACK", "ACCEPTED" (a bad file taken silently) and "WRONG" (a run whose
result is not what the file says) are failures. ``--show-accepted`` lists every accepted value for review.

    python benchmarks/bad_inputs.py [--only task|algorithm|mechanism|schedule|network|top] [--show-accepted]
    python benchmarks/bad_inputs.py --cli [--show-accepted] [--timeout 30]   # account, covariance, rms-bounds, …
    python benchmarks/bad_inputs.py --files                                  # bad files and folders

Each case is a tiny run (a 5-agent ring, 3 rounds), so the whole sweep takes minutes; the quick subset that runs in
the test suite is ``tests/test_bad_inputs.py``. The bad files and folders are ``bad_files.py``'s cases.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import math
import os
import re
import sys
import tempfile
import time
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Callable, NamedTuple

BASE = {
    "name": "fuzz", "seeds": [0], "iterations": 3, "eval_every": 1,
    "network": {"topology": "ring", "n": 5},
    "task": {"name": "quadratic"},
    "algorithm": {"name": "dsgd"},
    "mechanism": {"name": "none"},
    "schedule": {"name": "constant", "eta": 0.01},
}
#: what a user might type where a number, a name or a flag belongs
BAD_VALUES: list[object] = ["abc", "", -1, 0, 1e300, float("nan"), float("-inf"), True, [], [1, 2], {"a": 1}]
#: components that need another setting to be buildable at all (the section's base is then this, not BASE)
#: image models whose every accepted case trains a CNN for ~30 s on 2 cores: only their defaults run here (their keys
#: are the image loader's, fuzzed through ``cnn``)
DEFAULTS_ONLY = {("task", "sigmoid_cnn"), ("task", "resnet9")}
IMAGES = {"eval_every": 0, "task": {"train_size": 100}}  # image models: evaluate the test set twice, not per round
CONTEXT = {
    ("algorithm", "dinno"): {"task": {"name": "logistic", "dataset": "breast_cancer"}},
    **{("task", name): IMAGES for name in ("cnn", "mlp", "resnet9", "sigmoid_cnn", "softmax")},
}


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("-inf" if v == -math.inf else ("inf" if v == math.inf else repr(v)))
    if isinstance(v, (int,)):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def to_toml(cfg: dict) -> str:
    top = [f"{k} = {toml_value(v)}" for k, v in cfg.items() if not isinstance(v, dict)]
    sections = [f"[{k}]\n" + "\n".join(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())
                for k, v in cfg.items() if isinstance(v, dict)]
    text = "\n".join(top) + "\n\n" + "\n\n".join(sections) + "\n"
    tomllib.loads(text)  # our own writer must produce TOML
    return text


def merged(base: dict, extra: dict) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k].update(v)
        else:
            out[k] = v
    return out


class Case(NamedTuple):
    """A config to run: its label, the config, and whether its value has the wrong type for the key (accepting
    it would run something the user did not mean)."""

    label: str
    config: dict
    mistyped: bool = False


def _kinds(annotation: Any) -> set[str]:
    """The value kinds a key annotation admits: int, float, bool, str, list (Annotated and unions unwrapped)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return set()
    if typing.get_origin(annotation) is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(_kinds(a) for a in typing.get_args(annotation)))
    if typing.get_origin(annotation) in (list, tuple) or annotation in (list, tuple):
        return {"list"}
    if isinstance(annotation, tuple):  # the fixed keys' (int, str)
        return set().union(*(_kinds(a) for a in annotation))
    return {annotation.__name__} if annotation in (int, float, bool, str) else set()


def _choices(annotation: Any) -> tuple[str, ...]:
    """The names a key's annotation allows, where it lists them."""
    from privdl.registry import annotated_choices

    for c in annotated_choices(annotation):
        if c.names():
            return tuple(str(n) for n in c.names())
    return ()


def _fixed(dotted: str, typ: Any) -> Any:
    """A fixed key's type as an annotation, with the names it must be one of."""
    from privdl.experiment.config_schema import FIXED_CHOICES

    typ = typing.Union[typ] if isinstance(typ, tuple) else typ  # noqa: UP007 - (int, str) as a type
    return typing.Annotated[typ, FIXED_CHOICES[dotted]] if dotted in FIXED_CHOICES else typ


def typed_values(annotation: Any, default: Any = None) -> list[tuple[object, bool]]:
    """(value, mistyped) pairs a user types for a key of this type: quoted numbers, a float for an integer, text
    for a boolean, another case of a name, a number for a list — and the type's own extremes (5e-324, -0.0,
    2**63), which are legal types."""
    kinds = _kinds(annotation)
    out: list[tuple[object, bool]] = []
    if "bool" in kinds:
        out += [("true", True), (1, "int" not in kinds), ("yes", "str" not in kinds)]
    if "int" in kinds:
        out += [("5", "str" not in kinds), (2.5, "float" not in kinds), (10.0, "float" not in kinds), (2**63, False)]
    if "float" in kinds:
        out += [("0.5", "str" not in kinds), ("1e-3", "str" not in kinds), (5e-324, False), (-0.0, False)]
    if "str" in kinds:
        names = _choices(annotation)
        name = names[0] if names else default if isinstance(default, str) and default else "x"
        out += [(name.upper() if name.upper() != name else name.lower(), bool(names)), (name + " ", bool(names))]
    if "list" in kinds:
        out += [(0.5, True), (["a", "b"], True)]
    seen, unique = set(), []
    for value, mistyped in out:  # 1 == true and 10.0 == 10 as keys: tell them apart by type
        key = (type(value).__name__, repr(value))
        if key not in seen:
            seen.add(key)
            unique.append((value, mistyped))
    return unique


def _key_cases(label: str, base: dict, put: Callable[[object], dict], annotation: Any, default: Any,
               typed: bool) -> list[Case]:
    cases = [Case(f"{label} = {toml_value(v)}", merged(base, put(v))) for v in BAD_VALUES]
    if typed:
        generic = {(type(b), repr(b)) for b in BAD_VALUES}
        cases += [Case(f"{label} = {toml_value(v)}" + (" (mistyped)" if bad else ""), merged(base, put(v)), bad)
                  for v, bad in typed_values(annotation, default) if (type(v), repr(v)) not in generic]
    return cases


def cases(only: str | None = None, *, typed: bool = True) -> list[Case]:
    """Every fixed key and every component parameter × BAD_VALUES (and, with ``typed``, × the values a user
    mistypes for the key's type, :func:`typed_values`)."""
    from privdl.experiment.config_schema import NETWORK_FIXED, SECTIONS, TOP_LEVEL, _component_keys

    out: list[Case] = []
    if only in (None, "top"):
        for key, (typ, default) in TOP_LEVEL.items():
            if key in ("name", "description", "base_dir"):
                continue
            out += _key_cases(key, BASE, lambda v, k=key: {k: v}, _fixed(key, typ), default, typed)
    if only in (None, "network"):
        for key, (typ, default) in NETWORK_FIXED.items():
            out += _key_cases(f"network.{key}", BASE, lambda v, k=key: {"network": {k: v}},
                              _fixed(f"network.{key}", typ), default, typed)
        for top in ("erdos_renyi", "random_geometric", "grid", "torus", "regular", "small_world", "star"):
            try:
                keys = _component_keys("network", top)
            except Exception:  # a topology of another version: skip
                continue
            for key, param in keys.items():
                out += _key_cases(f"network[{top}].{key}", BASE,
                                  lambda v, k=key, t=top: {"network": {"topology": t, "n": 12, k: v}},
                                  param.annotation, param.default, typed)
    for section, registry in SECTIONS.items():
        if only not in (None, section):
            continue
        for name in registry.names():
            context = CONTEXT.get((section, name), {})
            if context is None:
                continue
            base = merged(merged(BASE, context), {section: {"name": name}})
            if section != "schedule":
                base[section] = {"name": name, **{k: v for k, v in context.get(section, {}).items() if k != "name"}}
            out.append(Case(f"{section}[{name}] defaults", base))
            if (section, name) in DEFAULTS_ONLY:
                continue
            for key, param in _component_keys(section, name).items():
                out += _key_cases(f"{section}[{name}].{key}", base, lambda v, s=section, k=key: {s: {k: v}},
                                  param.annotation, param.default, typed)
    return out


#: a valid command line per command; each of its options then gets every value of CLI_BAD in turn
CLI_BASE = {
    "account": ["account", "--epsilon", "1", "--steps", "10", "--clip", "1"],
    "account-example": ["account", "--unit", "example", "--noise-multiplier", "1", "--sample-rate", "0.01",
                        "--steps", "10"],
    "covariance": ["covariance", "--topology", "ring", "--n", "5", "--epsilon", "1"],
    "rms-bounds": ["rms-bounds", "--topology", "ring", "--n", "5", "--dim", "2"],
    "reproduce": ["reproduce", "quadratic", "--seeds", "1"],
    "audit": ["audit", "--model", "softmax", "--models", "4", "--iterations", "2", "--held-out", "0.5",
              "--data-dir", str((Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve())],
}
#: the commands whose valid lines finish in well under a second (the test suite sweeps these)
CLI_FAST = ("account", "account-example", "covariance", "rms-bounds")
CLI_BAD = ["abc", "-1", "0", "1e300", "nan", "inf", ""]


def cli_cases(only: tuple[str, ...] | None = None) -> list[tuple[str, list[str]]]:
    """(label, argv) for every value option of the commands in CLI_BASE × CLI_BAD (``run`` is the config sweep);
    the first case of each command is its valid base line."""
    import typer.main

    from privdl.cli import app

    commands = typer.main.get_command(app).commands
    out = []
    for label, base in CLI_BASE.items():
        if only is not None and label not in only:
            continue
        out.append((f"{label} (base)", list(base)))
        for param in commands[base[0]].params:
            if getattr(param, "is_flag", False) or not param.opts or not param.opts[0].startswith("--"):
                continue
            opt = param.opts[0]
            argv = list(base)
            if opt in argv:  # replace the base's value
                i = argv.index(opt)
                del argv[i:i + 2]
            out += [(f"{label} {opt} {v!r}", [*argv, opt, v]) for v in CLI_BAD]
    return out


class Slow(Exception):
    pass


def _alarm(signum, frame):  # noqa: ARG001
    raise Slow()


def explains(text: str) -> bool:
    """Whether a failed command's output explains itself: an "error: …" line (privdl's) or a usage error
    ("Error … Invalid value …", typer's box) followed by a few words — not a bare "Aborted.", an empty message or
    just a quoted key (a KeyError's text)."""
    flat = " ".join(re.sub(r"[│╭╮╰╯─]+", " ", text).split())
    m = re.search(r"\b[Ee]rror:?\s+(.*)", flat)
    return bool(m) and len(re.findall(r"[^\W\d_]{2,}", m.group(1))) >= 3


def _invoke(argv: list[str], timeout: int) -> tuple[str | None, str]:
    """Run ``privdl argv`` in this process: ('slow' | 'TRACEBACK' | 'error' | 'UNCLEAR', what it printed), or
    (None, its output) when the command ended without an error. 'error' is a non-zero exit whose message explains
    (:func:`explains`); any other non-zero exit ("Aborted.", nothing) is 'UNCLEAR'."""
    import signal

    from typer.testing import CliRunner

    from privdl.cli import app

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        res = CliRunner().invoke(app, argv)
    except Slow:
        return "slow", f"still running after {timeout} s"
    finally:
        signal.alarm(0)
    if isinstance(res.exception, Slow):
        return "slow", f"still running after {timeout} s"
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        tb = "".join(traceback.format_exception(res.exception)).strip().splitlines()
        return "TRACEBACK", f"{tb[-1]} (at {tb[-3].strip() if len(tb) > 2 else ''})"
    text = " ".join(res.output.split())
    if res.exit_code == 0:
        return None, text
    return ("error" if explains(res.output) else "UNCLEAR"), (text[:300] or f"(nothing; exit {res.exit_code})")


def run_cli_case(argv: list[str], folder: Path, timeout: int = 30) -> tuple[str, str]:
    """('error' | 'ran' | 'slow' | 'TRACEBACK' | 'UNCLEAR', what it printed), for one command line run in
    ``folder``."""
    here = os.getcwd()
    os.chdir(folder)  # outputs (reproduce, audit) land in the scratch folder
    try:
        outcome, text = _invoke(argv, timeout)
    finally:
        os.chdir(here)
    return (outcome, text) if outcome else ("ran", text)


def run_case(case: Case | dict, folder: Path, timeout: int = 60) -> tuple[str, str]:
    """('error' | 'ran' | 'ran-flagged' | 'ran-nonfinite' | 'ran-mistyped' | 'slow' | 'TRACEBACK' | 'UNCLEAR', the
    first line of what it printed) for a config (a :class:`Case`, or a bare config dict)."""
    case = case if isinstance(case, Case) else Case("config", case)
    path = folder / "c.toml"
    path.write_text(to_toml(case.config))
    out = folder / "out"
    outcome, text = _invoke(["run", str(path), "--out", str(out), "--no-plot", "--quiet"], timeout)
    if outcome:
        return outcome, text
    if case.mistyped:
        return "ran-mistyped", "a value of the wrong type was accepted and ran"
    bad = []
    if (out / "results.csv").exists():
        with open(out / "results.csv") as f:
            for row in csv.DictReader(f):
                bad += [k for k, v in row.items() if v and v.lower() in ("nan", "inf", "-inf")]
    if bad and "ended with nan or inf metrics" in text:
        return "ran-flagged", f"non-finite {sorted(set(bad))}, and the warning said so"
    return ("ran-nonfinite" if bad else "ran"), (f"non-finite: {sorted(set(bad))}" if bad else "")


#: outcomes of a config case that fail the sweep
FAILURES = ("TRACEBACK", "UNCLEAR", "ran-nonfinite", "ran-mistyped", "slow")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["top", "network", "task", "algorithm", "mechanism", "schedule"])
    ap.add_argument("--show-accepted", action="store_true", help="list every accepted value, not only non-finite")
    ap.add_argument("--timeout", type=int, default=60, help="seconds a case may run before it is called slow")
    ap.add_argument("--start", type=int, default=0, help="skip the first cases")
    ap.add_argument("--cli", action="store_true", help="the other commands' options instead of config keys")
    ap.add_argument("--files", action="store_true", help="bad files and folders instead of config keys")
    args = ap.parse_args()
    if args.files:
        from bad_files import FILE_FAILURES, file_cases, run_file_case

        counts: dict[str, int] = {}
        t0 = time.perf_counter()
        for case in file_cases():
            with tempfile.TemporaryDirectory() as tmp:
                outcome, text = run_file_case(case, Path(tmp), args.timeout)
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome in FILE_FAILURES or args.show_accepted:
                print(f"{outcome:10s} {case.label}: {text}", flush=True)
        print(f"\n{sum(counts.values())} files and folders in {time.perf_counter() - t0:.0f} s: "
              + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        raise SystemExit(1 if any(counts.get(k) for k in FILE_FAILURES) else 0)
    if args.cli:
        counts = {}
        t0 = time.perf_counter()
        for label, argv in cli_cases():
            with tempfile.TemporaryDirectory() as tmp:
                outcome, text = run_cli_case(argv, Path(tmp), args.timeout)
            if label.endswith("(base)") and outcome != "ran":
                outcome, text = "BASE-FAILS", f"the valid line did not run, so its cases prove nothing: {text}"
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome != "error" and (outcome != "ran" or args.show_accepted):
                print(f"{outcome:10s} {label}: {text}", flush=True)
        print(f"\n{sum(counts.values())} command lines in {time.perf_counter() - t0:.0f} s: "
              + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        raise SystemExit(1 if counts.get("TRACEBACK") or counts.get("UNCLEAR") or counts.get("BASE-FAILS") else 0)
    todo = cases(args.only)
    counts = {}
    t0 = time.perf_counter()
    for k, case in enumerate(todo):
        if k < args.start:
            continue
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            outcome, text = run_case(case, Path(tmp), args.timeout)
        counts[outcome] = counts.get(outcome, 0) + 1
        if time.perf_counter() - t > 10 and outcome != "slow":
            print(f"({time.perf_counter() - t:.0f} s: {case.label})", file=sys.stderr, flush=True)
        if outcome in FAILURES or (args.show_accepted and outcome == "ran"):
            print(f"{outcome:14s} {case.label}: {text}", flush=True)
        if (k + 1) % 100 == 0:
            print(f"  … {k + 1}/{len(todo)} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"\n{len(todo)} inputs in {time.perf_counter() - t0:.0f} s: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if any(counts.get(k) for k in FAILURES):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
