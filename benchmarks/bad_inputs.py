"""Bad-input sweep (issue 16): every parameter of every registered component, and every fixed key, given values a
user might mistype, each run through ``privdl run`` in this process. The contract is: **no traceback** — every
input ends in a clear error (exit 2, "error: …") or a finished run — and **no silent nan**: a legal value whose run
overflows (``curvature = 1e300``) must end with the warning that names the non-finite metrics ("ran-flagged").
``--show-accepted`` lists every accepted value for review.

    python benchmarks/bad_inputs.py [--only task|algorithm|mechanism|schedule|network|top] [--show-accepted]
    python benchmarks/bad_inputs.py --cli [--show-accepted] [--timeout 30]   # account, covariance, rms-bounds, …

Each case is a tiny run (a 5-agent ring, 3 rounds), so the whole sweep takes minutes; the quick subset that runs in
the test suite is ``tests/test_bad_inputs.py``.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import tempfile
import time
import tomllib
from pathlib import Path

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


def cases(only: str | None = None) -> list[tuple[str, dict]]:
    """(label, config) for every fixed key and every component parameter × BAD_VALUES."""
    from privdl.experiment.config import NETWORK_FIXED, SECTIONS, TOP_LEVEL, _component_keys

    out: list[tuple[str, dict]] = []
    if only in (None, "top"):
        for key in TOP_LEVEL:
            if key in ("name", "description", "base_dir"):
                continue
            out += [(f"{key} = {toml_value(v)}", merged(BASE, {key: v})) for v in BAD_VALUES]
    if only in (None, "network"):
        for key in NETWORK_FIXED:
            out += [(f"network.{key} = {toml_value(v)}", merged(BASE, {"network": {key: v}})) for v in BAD_VALUES]
        for top in ("erdos_renyi", "random_geometric", "grid", "torus", "regular", "small_world", "star"):
            try:
                keys = _component_keys("network", top)
            except Exception:  # a topology of another version: skip
                continue
            for key in keys:
                out += [(f"network[{top}].{key} = {toml_value(v)}",
                         merged(BASE, {"network": {"topology": top, "n": 12, key: v}})) for v in BAD_VALUES]
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
            out.append((f"{section}[{name}] defaults", base))
            if (section, name) in DEFAULTS_ONLY:
                continue
            for key in _component_keys(section, name):
                out += [(f"{section}[{name}].{key} = {toml_value(v)}", merged(base, {section: {key: v}}))
                        for v in BAD_VALUES]
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


def _invoke(argv: list[str], timeout: int) -> tuple[str | None, str]:
    """Run ``privdl argv`` in this process: ('slow' | 'TRACEBACK' | 'error', what it printed), or (None, its output)
    when the command ended without an error."""
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
    return ("error", text[:300]) if res.exit_code != 0 else (None, text)


def run_cli_case(argv: list[str], folder: Path, timeout: int = 30) -> tuple[str, str]:
    """('error' | 'ran' | 'slow' | 'TRACEBACK', what it printed), for one command line run in ``folder``."""
    import os

    here = os.getcwd()
    os.chdir(folder)  # outputs (reproduce, audit) land in the scratch folder
    try:
        outcome, text = _invoke(argv, timeout)
    finally:
        os.chdir(here)
    return (outcome, text) if outcome else ("ran", "")


def run_case(cfg: dict, folder: Path, timeout: int = 60) -> tuple[str, str]:
    """('error' | 'ran' | 'ran-nonfinite' | 'slow' | 'TRACEBACK', the first line of what it printed)."""
    path = folder / "c.toml"
    path.write_text(to_toml(cfg))
    out = folder / "out"
    outcome, text = _invoke(["run", str(path), "--out", str(out), "--no-plot", "--quiet"], timeout)
    if outcome:
        return outcome, text
    bad = []
    if (out / "results.csv").exists():
        with open(out / "results.csv") as f:
            for row in csv.DictReader(f):
                bad += [k for k, v in row.items() if v and v.lower() in ("nan", "inf", "-inf")]
    if bad and "ended with nan or inf metrics" in text:
        return "ran-flagged", f"non-finite {sorted(set(bad))}, and the warning said so"
    return ("ran-nonfinite" if bad else "ran"), (f"non-finite: {sorted(set(bad))}" if bad else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["top", "network", "task", "algorithm", "mechanism", "schedule"])
    ap.add_argument("--show-accepted", action="store_true", help="list every accepted value, not only non-finite")
    ap.add_argument("--timeout", type=int, default=60, help="seconds a case may run before it is called slow")
    ap.add_argument("--start", type=int, default=0, help="skip the first cases")
    ap.add_argument("--cli", action="store_true", help="the other commands' options instead of config keys")
    args = ap.parse_args()
    if args.cli:
        counts = {}
        t0 = time.perf_counter()
        for label, argv in cli_cases():
            with tempfile.TemporaryDirectory() as tmp:
                outcome, text = run_cli_case(argv, Path(tmp), args.timeout)
            counts[outcome] = counts.get(outcome, 0) + 1
            if label.endswith("(base)") and outcome != "ran":
                outcome, text = "BASE-FAILS", f"the valid line did not run, so its cases prove nothing: {text}"
                counts[outcome] = counts.get(outcome, 0) + 1
            if outcome != "error" and (outcome != "ran" or args.show_accepted):
                print(f"{outcome:10s} {label}: {text}", flush=True)
        print(f"\n{sum(counts.values())} command lines in {time.perf_counter() - t0:.0f} s: "
              + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        raise SystemExit(1 if counts.get("TRACEBACK") or counts.get("BASE-FAILS") else 0)
    todo = cases(args.only)
    counts: dict[str, int] = {}
    t0 = time.perf_counter()
    shown = []
    for k, (label, cfg) in enumerate(todo):
        if k < args.start:
            continue
        t = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            outcome, text = run_case(cfg, Path(tmp), args.timeout)
        counts[outcome] = counts.get(outcome, 0) + 1
        if time.perf_counter() - t > 10 and outcome != "slow":
            print(f"({time.perf_counter() - t:.0f} s: {label})", file=sys.stderr, flush=True)
        if outcome in ("TRACEBACK", "ran-nonfinite", "slow") or (args.show_accepted and outcome == "ran"):
            shown.append(f"{outcome:14s} {label}: {text}")
            print(shown[-1], flush=True)
        if (k + 1) % 100 == 0:
            print(f"  … {k + 1}/{len(todo)} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"\n{len(todo)} inputs in {time.perf_counter() - t0:.0f} s: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    if counts.get("TRACEBACK") or counts.get("ran-nonfinite") or counts.get("slow"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
