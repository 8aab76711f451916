"""privdl's rooms and their order (docs/ARCHITECTURE.md, "Rooms and their order"): every import of every module —
at the top of a file or inside a function, absolute or relative — goes to a room at or below the importer's, and no
modules import each other in a circle.

A room is a subpackage of privdl (``privdl/comm/``) or a top-level module (``privdl/keys.py``); ``privdl`` itself
(``privdl/__init__.py``: the version and the source hash) is the lowest. The scan reads the sources with :mod:`ast`,
so it sees what ``import`` statements name, not what a run happens to load.
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
    "private_file",   # files only their owner may read
    "process_defaults",  # the environment privdl's own processes start with (standard library only)
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
]


def modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of privdl under ``src``, by dotted name (a package by its own name)."""
    out = {}
    for path in sorted((src / "privdl").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) for every privdl module that ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
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
        for line, target in imports(name, path, known):
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
