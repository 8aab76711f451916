"""privdl's rooms and their order (docs/ARCHITECTURE.md, "Rooms and their order"): every import of every module —
at the top of a file or inside a function, absolute or relative — goes to a room at or below the importer's, and no
modules import each other in a circle.

A room is a subpackage of privdl (``privdl/comm/``) or a top-level module (``privdl/keys.py``); ``privdl`` itself
(``privdl/__init__.py``: the version and the source hash) is the lowest. The scan reads the sources with :mod:`ast`,
so it sees what ``import`` statements name, not what a run happens to load.

One import runs up by design: ``privdl/__init__.py`` re-exports the public face (``privdl.train``, ...) from the top
room, :data:`FACADE`, inside its module ``__getattr__`` — on first use, so that ``import privdl`` stays cheap. It is
the only upward import allowed, only from the package itself, only to the facade and only inside a function; it is
no edge of the import graph (the facade imports the package's version like every room).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

SRC = Path(__file__).resolve().parents[1] / "src"

#: privdl's rooms, lowest first: a module may import its own room and the rooms before it, never one after it
ROOMS = [
    "privdl",         # the package: version, source hash
    "errors",         # the exceptions every room raises
    "registry",       # named builders (topologies, tasks, mechanisms, ...)
    "plugins",        # modules imported before any name is checked (config, --plugin, entry points)
    "private_file",   # files only their owner may read
    "process_defaults",  # the environment privdl's own processes start with (standard library only)
    "lazy_module",    # a module imported on first use (standard library only)
    "placement",      # which agents an engine holds
    "runtime_spec",   # the [runtime] table, typed (RuntimeSpec): every reader of it is above
    "device",         # which torch device a run's ``device`` names
    "schedules",      # step sizes
    "keys",           # keyed draws and key sources
    "data",           # datasets, files, partitions
    "network",        # graphs, mixing weights, edges
    "tasks",          # losses, data access per agent, a held slice's view (HeldTask)
    "gradients",      # per-example gradients
    "comm",           # how rows talk; the in-process transport between slices
    "privacy",        # events, accountants, ledgers
    "covariance",     # correlated-noise designs
    "mechanisms",     # gradient- and message-side mechanisms
    "algorithms",     # (init, step) over the Comm
    "agreement",      # key agreement between agents, identities, stored secrets
    "simulator",      # the one round loop: single, stacked, sliced
    "experiment",     # configs -> runs -> results
    "runtime",        # runs of an experiment as processes (transport, launch, worker, torchrun entry)
    "attacks",        # attacks on transcripts
    "audit",          # membership audits of finished runs
    "reproductions",  # the papers' numbers and comparisons
    "cli",            # the privdl command
    "library",        # the public face: privdl.train, privdl.task_from_arrays, privdl.Network, the registries
]
#: the top room, which ``privdl/__init__.py`` alone may import — lazily, inside a function
FACADE = "library"


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of privdl under ``src``, by dotted name (a package by its own name)."""
    out = {}
    for path in sorted((src / "privdl").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path], *, top_level: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every privdl module that ``name`` imports anywhere in its file (``top_level``: only the
    imports that run when the module is loaded — outside every function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if top_level and _inside_function(tree, node):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            if target != "privdl" and not target.startswith("privdl."):
                continue
            while target not in known and "." in target:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target != name and (node.lineno, target) not in found:
                found.append((node.lineno, target))
    return found


def _inside_function(tree: ast.AST, target: ast.AST) -> bool:
    """Whether ``target`` lies inside a function (or lambda) of ``tree``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and node is not target:
            if any(inner is target for inner in ast.walk(node)):
                return True
    return False


def lazy_facade(name: str, target: str, line: int, eager: set[tuple[int, str]]) -> bool:
    """The one upward import allowed: the package ``privdl`` importing the facade room inside a function."""
    return name == "privdl" and room(target) == FACADE and (line, target) not in eager


def room(module: str) -> str:
    return module.split(".")[1] if "." in module else "privdl"


def check(src: Path = SRC) -> list[str]:
    """What breaks the order: upward imports (file, line, imported module), modules in no room, and cycles."""
    known = modules(src)
    graph = nx.DiGraph()
    where: dict[tuple[str, str], str] = {}
    problems = []
    for name, path in known.items():
        graph.add_node(name)
        if room(name) not in ROOMS:
            problems.append(f"{path.relative_to(src)}: room {room(name)!r} is not in ROOMS (add it in its place)")
            continue
        eager = set(imports(name, path, known, top_level=True)) if name == "privdl" else set()
        for line, target in imports(name, path, known):
            if lazy_facade(name, target, line, eager):
                continue
            graph.add_edge(name, target)
            at = f"{path.relative_to(src)}:{line}"
            where.setdefault((name, target), at)
            if room(target) in ROOMS and ROOMS.index(room(target)) > ROOMS.index(room(name)):
                problems.append(f"{at}: {name} imports {target} — room {room(target)!r} is above {room(name)!r}")
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = nx.find_cycle(graph.subgraph(component))
            problems.append("import cycle: " + " -> ".join(f"{a} ({where[(a, b)]})" for a, b in cycle)
                            + f" -> {cycle[0][0]}")
    return problems


def test_rooms_are_listed_once():
    assert len(ROOMS) == len(set(ROOMS))


def test_every_import_goes_down_or_sideways_and_none_in_a_circle():
    problems = check()
    assert not problems, "\n".join(problems)


def test_the_scan_sees_every_kind_of_import(tmp_path):
    """An upward import inside a function, a relative one and a cycle are each found, naming file and line."""
    pkg = tmp_path / "privdl"
    for folder in ("keys", "comm"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "keys" / "a.py").write_text("def f():\n    from privdl.comm import b\n")
    (pkg / "comm" / "b.py").write_text("from . import c\n")
    (pkg / "comm" / "c.py").write_text("import privdl.comm.b\nfrom privdl.keys.a import f\n")
    problems = check(tmp_path)
    assert any(p.startswith("privdl/keys/a.py:2: privdl.keys.a imports privdl.comm.b ") for p in problems), problems
    assert any(p.startswith("import cycle:") and "privdl.comm.b" in p and "privdl.comm.c" in p for p in problems)
    assert len(problems) == 2, problems


def test_only_the_package_may_import_the_facade_and_only_lazily(tmp_path):
    """The package's lazy re-export of the facade passes; the same import at the top of privdl/__init__.py, or from
    any other room, is an upward import."""
    pkg = tmp_path / "privdl"
    for folder in ("keys", FACADE):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("import privdl\n")
    (pkg / "__init__.py").write_text(f"def __getattr__(name):\n    from privdl import {FACADE}\n    return {FACADE}\n")
    assert check(tmp_path) == []
    (pkg / "keys" / "__init__.py").write_text(f"def f():\n    from privdl import {FACADE}\n")
    problems = check(tmp_path)
    assert len(problems) == 1 and problems[0].startswith(f"privdl/keys/__init__.py:2: privdl.keys imports "
                                                         f"privdl.{FACADE} "), problems
    (pkg / "keys" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(f"from privdl import {FACADE}\n")
    problems = check(tmp_path)
    assert any(p.startswith(f"privdl/__init__.py:1: privdl imports privdl.{FACADE} ") for p in problems), problems


def test_the_facade_is_the_top_room():
    assert ROOMS[-1] == FACADE


def test_import_privdl_is_cheap_and_changes_no_environment_variable():
    """``import privdl`` loads neither torch nor the facade and leaves os.environ as it was; the first public name
    used loads the facade, and every name the package promises is there."""
    import subprocess
    import sys

    code = ("import os, sys; before = dict(os.environ); import privdl; "
            "assert dict(os.environ) == before, 'environment changed'; "
            "assert 'torch' not in sys.modules and 'privdl.library' not in sys.modules, 'heavy import'; "
            "assert privdl.train.__module__ == 'privdl.library.training'; "
            "import privdl.library as face; assert sorted(face.__all__) == sorted(privdl._PUBLIC), 'names differ'; "
            "assert all(getattr(privdl, n) is getattr(face, n) for n in face.__all__); "
            "assert dict(os.environ) == before, 'environment changed by the facade'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert out.stdout.strip() == "ok", out.stderr
