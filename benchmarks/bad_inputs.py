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
the test suite is ``tests/test_bad_inputs.py``.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import tomllib
import types
import typing
from dataclasses import dataclass
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
    from privdl.experiment.config import FIXED_CHOICES

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
    from privdl.experiment.config import NETWORK_FIXED, SECTIONS, TOP_LEVEL, _component_keys

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


# ---- bad files and folders -----------------------------------------------------------------------------------------
@dataclass
class FileCase:
    """A command line run in a scratch folder holding ``files`` (name → bytes, text, or a function of the folder
    that makes it). ``names``: the file the error must name ("" where the input is legitimate and must run);
    ``experiment``: a finished tiny experiment is copied to ``exp/`` first; ``check(folder, output)``: for a case
    that runs, what is wrong with its result (None: right)."""

    label: str
    argv: list[str]
    files: dict[str, Any]
    names: str = ""
    experiment: bool = False
    check: Callable[[Path, str], str | None] | None = None


CONFIG = ('name = "fuzz"\nseeds = [0]\niterations = 3\neval_every = 1\n[network]\ntopology = "ring"\nn = 5\n'
          '[task]\nname = "quadratic"\n[schedule]\nname = "constant"\neta = 0.01\n')
NET_CONFIG = CONFIG.replace('topology = "ring"\nn = 5\n', 'file = "net.txt"\n')
RUN = ["run", "c.toml", "--out", "out", "--no-plot", "--quiet"]
COV = ["covariance", "--epsilon", "1", "--steps", "10", "--mixing"]


def _npy(a: Any, **kw: Any) -> bytes:
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.asarray(a, **kw), allow_pickle=True)
    return buf.getvalue()


def _ring_w(n: int = 5) -> list[list[float]]:
    return [[1 / 3 if (i - j) % n in (0, 1, n - 1) else 0.0 for j in range(n)] for i in range(n)]


def _csv(rows: list[list[float]], sep: str = ",") -> str:
    return "".join(sep.join(repr(x) for x in r) + "\n" for r in rows)


def _directed_w(n: int = 4) -> list[list[float]]:
    """(I + P)/2 with P a cyclic shift: doubly stochastic, connected, primitive — and directed."""
    return [[0.5 if j in (i, (i + 1) % n) else 0.0 for j in range(n)] for i in range(n)]


def _agents(n: int) -> Callable[[Path, str], str | None]:
    def check(folder: Path, _: str) -> str | None:
        mans = sorted((folder / "out" / "runs").glob("*/manifest.json"))
        if not mans:
            return "no finished run"
        got = json.loads(mans[0].read_text())["network"]["n"]
        return None if got == n else f"the network has {got} agents, the file {n}"
    return check


def _same_as_plain(folder: Path, _: str) -> str | None:
    """A config in another encoding runs the same experiment as the plain UTF-8 one."""
    mans = sorted((folder / "out" / "runs").glob("*/manifest.json"))
    if not mans:
        return "no finished run"
    from privdl.experiment.config import expand

    expected = expand(tomllib.loads(CONFIG))[0][0].run_id
    return None if mans[0].parent.name == expected else f"run {mans[0].parent.name}, not {expected}"


def _left_behind(folder: Path, output: str) -> str | None:
    """A merge that left its one damaged run behind, and said so."""
    said = "1 unfinished or damaged left behind" in output and "0 runs copied" in output
    return None if said else f"the merge did not say it left the damaged run behind: {output[:200]}"


def _mutate(path: str, how: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        target = next(folder.glob(path)) if any(c in path for c in "*?") else folder / path
        target.write_bytes(how(target.read_bytes()))
    return make


def _read_only(folder: Path) -> None:
    """A folder no one may write in (as root, where permissions do not bind, a read-only file system's folder)."""
    ro = folder / "ro"
    ro.mkdir()
    ro.chmod(0o555)


def _ro_out() -> str:
    return "/proc/privdl-cannot-write" if os.geteuid() == 0 else "ro/out"


def file_cases() -> list[FileCase]:
    """Bad files and folders for every command that reads one (and the legitimate variants that must run)."""
    w = _ring_w()
    cut = lambda b: b[: len(b) * 2 // 3]  # noqa: E731  a file cut short (an interrupted copy, a full disk)
    junk = bytes(range(256)) * 4
    c: list[FileCase] = [
        # configs
        FileCase("config missing", RUN, {}, "c.toml"),
        FileCase("config is a folder", RUN, {"c.toml/x": "1"}, "c.toml"),
        FileCase("config empty", RUN, {"c.toml": ""}, "c.toml"),
        FileCase("config white space", RUN, {"c.toml": "\n  \n"}, "c.toml"),
        FileCase("config UTF-8 with BOM", RUN, {"c.toml": b"\xef\xbb\xbf" + CONFIG.encode()}, check=_same_as_plain),
        FileCase("config UTF-16 LE with BOM", RUN, {"c.toml": CONFIG.encode("utf-16")}, check=_same_as_plain),
        FileCase("config UTF-16 BE with BOM", RUN, {"c.toml": b"\xfe\xff" + CONFIG.encode("utf-16-be")},
                 check=_same_as_plain),
        FileCase("config UTF-16 without BOM", RUN, {"c.toml": CONFIG.encode("utf-16-le")}, "c.toml"),
        FileCase("config Latin-1", RUN, {"c.toml": ("# café\n" + CONFIG).encode("latin-1")}, "c.toml"),
        FileCase("config binary junk", RUN, {"c.toml": junk}, "c.toml"),
        FileCase("config is a .npy", RUN, {"c.toml": _npy(w)}, "c.toml"),
        FileCase("config gzip-compressed", RUN, {"c.toml": __import__("gzip").compress(CONFIG.encode())}, "c.toml"),
        FileCase("config is JSON", RUN, {"c.toml": json.dumps(tomllib.loads(CONFIG))}, "c.toml"),
        FileCase("config cut short in a string", RUN, {"c.toml": CONFIG[: CONFIG.index("constant") + 4]}, "c.toml"),
        FileCase("config cut short in a table name", RUN, {"c.toml": CONFIG[: CONFIG.index("[schedule]") + 5]},
                 "c.toml"),
        FileCase("config with a NUL byte", RUN, {"c.toml": CONFIG.replace("fuzz", "fu\x00zz")}, "c.toml"),
        FileCase("config through a file", ["run", "f/c.toml", "--out", "out"], {"f": "x"}, "f/c.toml"),
        # W for covariance --mixing (and rms-bounds)
        FileCase("W empty .npy", [*COV, "w.npy"], {"w.npy": b""}, "w.npy"),
        FileCase("W .npy cut short", [*COV, "w.npy"], {"w.npy": cut(_npy(w))}, "w.npy"),
        FileCase("W .npy header only", [*COV, "w.npy"], {"w.npy": _npy(w)[:128]}, "w.npy"),
        FileCase("W .npy of objects", [*COV, "w.npy"], {"w.npy": _npy([[1, "a"], [None, 2]], dtype=object)},
                 "w.npy"),
        FileCase("W .npy complex", [*COV, "w.npy"], {"w.npy": _npy(w, dtype=complex)}, "w.npy"),
        FileCase("W .npy of text", [*COV, "w.npy"], {"w.npy": _npy([["a", "b"], ["c", "d"]])}, "w.npy"),
        FileCase("W .npy 1-d", [*COV, "w.npy"], {"w.npy": _npy([1.0, 0.0])}, "w.npy"),
        FileCase("W .npy 3-d", [*COV, "w.npy"], {"w.npy": _npy([w, w])}, "w.npy"),
        FileCase("W .npy a single number", [*COV, "w.npy"], {"w.npy": _npy(1.0)}, "w.npy"),
        FileCase("W .npy of no numbers", [*COV, "w.npy"], {"w.npy": _npy(__import__("numpy").zeros((0, 0)))},
                 "w.npy"),
        FileCase("W .npy of integers (an adjacency)", [*COV, "w.npy"], {"w.npy": _npy([[0, 1], [1, 0]])}, "w.npy"),
        FileCase("W .npz", [*COV, "w.npz"], {"w.npz": lambda f: __import__("numpy").savez(f / "w.npz", w=w)},
                 "w.npz"),
        FileCase("W text named .npy", [*COV, "w.npy"], {"w.npy": _csv(w)}, "w.npy"),
        FileCase("W .csv", [*COV, "w.csv"], {"w.csv": _csv(w)}),
        FileCase("W .txt with spaces", [*COV, "w.txt"], {"w.txt": _csv(w, " ")}),
        FileCase("W .csv UTF-16", [*COV, "w.csv"], {"w.csv": _csv(w).encode("utf-16")}),
        FileCase("W .csv with BOM and CRLF", [*COV, "w.csv"],
                 {"w.csv": b"\xef\xbb\xbf" + _csv(w).replace("\n", "\r\n").encode()}),
        FileCase("W .csv Latin-1 comment", [*COV, "w.csv"], {"w.csv": ("# matrice é\n" + _csv(w)).encode("latin-1")},
                 "w.csv"),
        FileCase("W .csv empty", [*COV, "w.csv"], {"w.csv": ""}, "w.csv"),
        FileCase("W .csv only comments", [*COV, "w.csv"], {"w.csv": "# W\n# nothing\n"}, "w.csv"),
        FileCase("W .csv with nan", [*COV, "w.csv"], {"w.csv": _csv(w).replace(repr(1 / 3), "nan", 1)}, "w.csv"),
        FileCase("W .csv with inf", [*COV, "w.csv"], {"w.csv": _csv(w).replace("0.0", "inf", 1)}, "w.csv"),
        FileCase("W .csv ragged", [*COV, "w.csv"], {"w.csv": _csv(w).rsplit(",", 1)[0] + "\n"}, "w.csv"),
        FileCase("W .csv cut short", [*COV, "w.csv"], {"w.csv": _csv(w)[: len(_csv(w)) * 2 // 3]}, "w.csv"),
        FileCase("W .csv with a header", [*COV, "w.csv"], {"w.csv": "a,b,c,d,e\n" + _csv(w)}, "w.csv"),
        FileCase("W .csv empty cell", [*COV, "w.csv"], {"w.csv": _csv(w).replace(",", ",,", 1)}, "w.csv"),
        FileCase("W .csv semicolons", [*COV, "w.csv"], {"w.csv": _csv(w, ";")}, "w.csv"),
        FileCase("W .csv decimal commas", [*COV, "w.csv"],
                 {"w.csv": "".join(";".join(f"{x:.4f}".replace(".", ",") for x in r) + "\n" for r in w)}, "w.csv"),
        FileCase("W directed (.npy)", [*COV, "w.npy"], {"w.npy": _npy(_directed_w())}, "w.npy"),
        FileCase("W directed (.csv)", [*COV, "w.csv"], {"w.csv": _csv(_directed_w(5))}, "w.csv"),
        FileCase("W directed to rms-bounds", ["rms-bounds", "--dim", "2", "--mixing", "w.npy"],
                 {"w.npy": _npy(_directed_w())}, "w.npy"),
        FileCase("W not square", [*COV, "w.csv"], {"w.csv": _csv([r[:3] for r in w])}, "w.csv"),
        FileCase("W an edge list of two lines", [*COV, "e.txt"], {"e.txt": "0 1\n1 2\n"}, "e.txt"),
        FileCase("W a binary junk file", [*COV, "w.dat"], {"w.dat": junk}, "w.dat"),
        FileCase("W a PNG image", [*COV, "w.png"], {"w.png": b"\x89PNG\r\n\x1a\n" + junk}, "w.png"),
        FileCase("W missing", [*COV, "w.npy"], {}, "w.npy"),
        FileCase("W a folder", [*COV, "w.npy"], {"w.npy/x": "1"}, "w.npy"),
        FileCase("W through a file", [*COV, "f/w.npy"], {"f": "x"}, "f/w.npy"),
        # network files of a config
        FileCase("edge list of two lines (a path of 3 agents)", RUN,
                 {"c.toml": NET_CONFIG, "net.txt": "0 1\n1 2\n"}, check=_agents(3)),
        FileCase("edge list of two lines in .npy", RUN,
                 {"c.toml": NET_CONFIG.replace("net.txt", "net.npy"), "net.npy": _npy([[0, 1], [1, 2]])},
                 check=_agents(3)),
        FileCase("edge list with reversed duplicates", RUN,
                 {"c.toml": NET_CONFIG, "net.txt": "0 1\n1 0\n1 2\n2 3\n3 0\n0 1\n"}, check=_agents(4)),
        FileCase("edge list .csv with comments and blank lines", RUN,
                 {"c.toml": NET_CONFIG.replace("net.txt", "net.csv"), "net.csv": "# ring\n0,1\n\n1,2\n2,0\n"},
                 check=_agents(3)),
        FileCase("edge list numbered from 1", RUN, {"c.toml": NET_CONFIG, "net.txt": "1 2\n2 3\n3 1\n"}, "net.txt"),
        FileCase("edge list negative agent", RUN, {"c.toml": NET_CONFIG, "net.txt": "0 1\n1 -2\n"}, "net.txt"),
        FileCase("edge list fractional agent", RUN, {"c.toml": NET_CONFIG, "net.txt": "0 1\n1 2.5\n2 0\n"},
                 "net.txt"),
        FileCase("edge list with weights (3 columns)", RUN,
                 {"c.toml": NET_CONFIG, "net.txt": "0 1 0.5\n1 2 0.5\n2 0 0.5\n"}, "net.txt"),
        FileCase("edge list with a header", RUN,
                 {"c.toml": NET_CONFIG.replace("net.txt", "net.csv"), "net.csv": "source,target\n0,1\n1,2\n2,0\n"},
                 "net.csv"),
        FileCase("edge list cut short", RUN, {"c.toml": NET_CONFIG, "net.txt": "0 1\n1 2\n2 3\n3"}, "net.txt"),
        FileCase("edge list empty", RUN, {"c.toml": NET_CONFIG, "net.txt": ""}, "net.txt"),
        FileCase("edge list of a trillion agents", RUN, {"c.toml": NET_CONFIG, "net.txt": "0 1\n1 1000000000000\n"},
                 "net.txt"),
        FileCase("edge list with an index beyond integers", RUN, {"c.toml": NET_CONFIG, "net.txt": "0 1\n1 1e300\n"},
                 "net.txt"),
        FileCase("edge list with file_kind = mixing", RUN,
                 {"c.toml": NET_CONFIG.replace('file = "net.txt"', 'file = "net.txt"\nfile_kind = "mixing"'),
                  "net.txt": "0 1\n1 2\n2 0\n"}, "net.txt"),
        FileCase("W with file_kind = adjacency", RUN,
                 {"c.toml": NET_CONFIG.replace('file = "net.txt"', 'file = "net.txt"\nfile_kind = "adjacency"'),
                  "net.txt": _csv(w)}, "net.txt"),
        FileCase("W with file_kind = edges", RUN,
                 {"c.toml": NET_CONFIG.replace('file = "net.txt"', 'file = "net.txt"\nfile_kind = "edges"'),
                  "net.txt": _csv(w)}, "net.txt"),
        FileCase("adjacency not symmetric", RUN,
                 {"c.toml": NET_CONFIG, "net.txt": "0 1 1\n0 0 1\n1 1 0\n"}, "net.txt"),
        FileCase("network W directed", RUN,
                 {"c.toml": NET_CONFIG.replace("net.txt", "w.npy"), "w.npy": _npy(_directed_w())}, "w.npy"),
        FileCase("network file missing", RUN, {"c.toml": NET_CONFIG}, "net.txt"),
        FileCase("network file a folder", RUN, {"c.toml": NET_CONFIG, "net.txt/x": "1"}, "net.txt"),
        FileCase("network file binary junk", RUN, {"c.toml": NET_CONFIG, "net.txt": junk}, "net.txt"),
        # covariance files R of a config
        *[FileCase(f"covariance R {label}", RUN,
                   {"c.toml": CONFIG + '[mechanism]\nname = "covariance"\nfile = "R.npy"\nprecision_bound = 1.0\n',
                    "R.npy": content}, "R.npy")
          for label, content in (("empty", b""), ("cut short", cut(_npy(w))), ("of objects", _npy([[1, "a"]],
                                 dtype=object)), ("text", _csv(w)), ("with nan", _npy([[float("nan")] * 5] * 5)),
                                 ("wrong shape", _npy([[1.0, 0.0], [0.0, 1.0]])), ("junk", junk))],
        FileCase("covariance R missing", RUN,
                 {"c.toml": CONFIG + '[mechanism]\nname = "covariance"\nfile = "R.npy"\nprecision_bound = 1.0\n'},
                 "R.npy"),
        # --out
        FileCase("--out is a file", [*RUN[:3], "f"], {"c.toml": CONFIG, "f": "x"}, "f"),
        FileCase("--out through a file", [*RUN[:3], "f/sub"], {"c.toml": CONFIG, "f": "x"}, "f/sub"),
        FileCase("--out read-only", [*RUN[:3], _ro_out()], {"c.toml": CONFIG, "ro": _read_only}, _ro_out()),
        FileCase("--out a foreign folder", [*RUN[:3], "mine"], {"c.toml": CONFIG, "mine/notes.txt": "x"}, "mine"),
        # experiment folders: experiment.json, metrics.csv, manifests
        *[FileCase(f"experiment.json {label}", [*RUN[:3], "exp"], {"c.toml": CONFIG, "": how}, "experiment.json",
                   experiment=True)
          for label, how in (("empty", _mutate("exp/experiment.json", lambda b: b"")),
                             ("cut short", _mutate("exp/experiment.json", cut)),
                             ("junk", _mutate("exp/experiment.json", lambda b: junk)),
                             ("a list", _mutate("exp/experiment.json", lambda b: b"[1, 2]")))],
        FileCase("metrics.csv cut short", [*RUN[:3], "exp"],
                 {"c.toml": CONFIG, "": _mutate("exp/runs/*/metrics.csv", lambda b: b[:-3])}, "metrics.csv",
                 experiment=True),
        FileCase("metrics.csv junk", [*RUN[:3], "exp"],
                 {"c.toml": CONFIG, "": _mutate("exp/runs/*/metrics.csv", lambda b: junk)}, "metrics.csv",
                 experiment=True),
        FileCase("metrics.csv other columns", [*RUN[:3], "exp"],
                 {"c.toml": CONFIG, "": _mutate("exp/runs/*/metrics.csv", lambda b: b"a,b\n1,2\n")},
                 "metrics.csv", experiment=True),
        FileCase("a damaged run manifest is run again", [*RUN[:3], "exp"],
                 {"c.toml": CONFIG, "": _mutate("exp/runs/*/manifest.json", cut)}, experiment=True),
        FileCase("merge from a folder without experiment.json", ["merge", "f", "--out", "m"], {"f/x.txt": "x"}, "f"),
        FileCase("merge from a file", ["merge", "f", "--out", "m"], {"f": "x"}, "f"),
        FileCase("merge from a damaged experiment.json", ["merge", "exp", "--out", "m"],
                 {"": _mutate("exp/experiment.json", cut)}, "experiment.json", experiment=True),
        FileCase("merge --out through a file", ["merge", "exp", "--out", "f/m"], {"f": "x"}, "f/m", experiment=True),
        FileCase("merge a damaged run manifest is left behind", ["merge", "exp", "--out", "m"],
                 {"": _mutate("exp/runs/*/manifest.json", lambda b: junk)}, experiment=True, check=_left_behind),
        FileCase("merge a cut metrics.csv is left behind", ["merge", "exp", "--out", "m"],
                 {"": _mutate("exp/runs/*/metrics.csv", cut)}, experiment=True, check=_left_behind),
        FileCase("merge from an experiment.json privdl cannot run", ["merge", "exp", "--out", "m"],
                 {"": _mutate("exp/experiment.json", lambda b: b'{"iterations": "many"}')}, "experiment.json",
                 experiment=True),
        FileCase("a run folder that is a file", [*RUN[:3], "exp"],
                 {"c.toml": CONFIG, "": lambda f: [(shutil.rmtree(d), d.write_text("x"))
                                                   for d in (f / "exp" / "runs").iterdir()]}, "exp/runs/",
                 experiment=True),
        FileCase("a run's manifest.json that is a folder", [*RUN[:3], "exp"],
                 {"c.toml": CONFIG, "": lambda f: [(m.unlink(), m.mkdir())
                                                   for m in (f / "exp" / "runs").glob("*/manifest.json")]},
                 "manifest.json", experiment=True),
        *[FileCase(f"manifest {label}", ["account", "--manifest", "m.json"], {"m.json": content}, "m.json")
          for label, content in (("empty", b""), ("cut short", b'{"run_id": "x", "privacy_ledger": [{"unit'),
                                 ("junk", junk), ("UTF-16", '{"a": 1}'.encode("utf-16-le")), ("a list", b"[]"))],
        FileCase("manifest folder without one", ["account", "--manifest", "d"], {"d/x": "1"}, "d"),
        # results.csv (an empty or header-only one is `privdl plot`'s own case)
        *[FileCase(f"results.csv {label}", ["plot", "exp"], {"": _mutate("exp/results.csv", how)}, "results.csv",
                   experiment=True)
          for label, how in (("cut short", lambda b: b[:-3]), ("junk", lambda b: junk),
                             ("other columns", lambda b: b"a,b\n1,2\n"),
                             ("a row too long", lambda b: b + b.splitlines()[-1] + b",9\n"))],
    ]
    return c


def _make(folder: Path, files: dict[str, Any]) -> None:
    for name, content in files.items():
        if callable(content):
            content(folder)
            continue
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())


_TEMPLATE: dict[str, Path] = {}


def _experiment_template() -> Path:
    """A finished tiny experiment (the CONFIG), made once per process and copied into the cases that need one."""
    if "exp" not in _TEMPLATE:
        from privdl.experiment import load_config, run_experiment

        root = Path(tempfile.mkdtemp(prefix="privdl-bad-files-"))
        (root / "c.toml").write_text(CONFIG)
        run_experiment(load_config(root / "c.toml"), root / "exp", progress=False)
        _TEMPLATE["exp"] = root / "exp"
    return _TEMPLATE["exp"]


def run_file_case(case: FileCase, folder: Path, timeout: int = 60) -> tuple[str, str]:
    """('error' | 'ran' | 'UNNAMED' | 'UNCLEAR' | 'TRACEBACK' | 'ACCEPTED' | 'REFUSED' | 'WRONG' | 'slow', what it
    printed) for one bad-file case, made and run in ``folder``."""
    if case.experiment:
        shutil.copytree(_experiment_template(), folder / "exp")
    _make(folder, case.files)
    outcome, text = run_cli_case(case.argv, folder, timeout)
    if outcome == "error":
        if not case.names:
            return "REFUSED", text
        return ("error", text) if case.names in text or Path(case.names).name in text else ("UNNAMED", text)
    if outcome != "ran":
        return outcome, text
    if case.names:
        return "ACCEPTED", f"ran without a word on {case.names}: {text[:200]}"
    wrong = case.check(folder, text) if case.check else None
    return ("WRONG", wrong) if wrong else ("ran", "")


#: outcomes of a file case that fail the sweep
FILE_FAILURES = ("UNNAMED", "UNCLEAR", "TRACEBACK", "ACCEPTED", "REFUSED", "WRONG", "slow")


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
