"""Bad files and folders (issue 29; ``python benchmarks/bad_inputs.py --files``): configs in other encodings, W and R
matrices and edge lists, network files of a config, manifests, experiment.json, metrics.csv and results.csv, and
``--out`` places, each given to the command that reads it. Each must end in a clear error that names the file
("error"), or — where the input is legitimate — run and give the right result ("ran"); :data:`FILE_FAILURES` are the
outcomes that fail. The config-key and command-option sweeps, and the command line, are in ``bad_inputs.py``.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from bad_inputs import run_cli_case

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
