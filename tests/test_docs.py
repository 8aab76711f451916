"""The documentation: every config key is in docs/CONFIG.md, every ```python block of the README and of docs/ runs
(each page's blocks in order, in a fresh process) and prints what the page says, the site's nav names every page and
only pages that exist, the README links only to files that exist, every CLI option has help text."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from privdl.experiment.config_schema import INJECTED, NETWORK_FIXED, SECTIONS, TOP_LEVEL, builder_params
from privdl.network.topology import TOPOLOGIES
from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DOC = (DOCS / "CONFIG.md").read_text()


def test_every_config_key_is_documented():
    keys = set(TOP_LEVEL) | set(NETWORK_FIXED)
    for name in TOPOLOGIES.names():
        keys |= set(builder_params(TOPOLOGIES.get(name), {"n", "seed"}))
    for section, registry in SECTIONS.items():
        for name in registry.names():
            keys |= set(builder_params(registry.get(name), INJECTED[section]))
            assert f"`{name}`" in DOC, f"{section} name {name!r} is not documented"
    missing = sorted(k for k in keys if f"| `{k}` |" not in DOC)
    assert not missing, f"undocumented config keys: {missing}"


#: the pages whose code is checked: the README and every page of the site
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
#: a ```python fence at the start of a line, up to the closing fence
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)

#: runs the blocks it is given on stdin (JSON: [[label, code], ...]) in order, in one namespace, as a reader would
_RUNNER = """
import json, sys
namespace = {"__name__": "__main__"}
for label, code in json.load(sys.stdin):
    exec(compile(code, label, "exec"), namespace)
"""


def python_blocks(page: Path) -> list[tuple[str, str]]:
    """Every ```python block of ``page``, labelled with the page and the line it starts on."""
    text = page.read_text()
    return [(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 2}", m.group(1))
            for m in PYTHON_BLOCK.finditer(text)]


def run_blocks(page: Path, cwd: Path) -> str:
    """Run ``page``'s python blocks in order in a fresh interpreter (``cwd`` as working directory — what a block
    writes, e.g. a saved run, lands there, not in the repository —, the shared data folder as ``PRIVDL_DATA_DIR``,
    one torch thread); what they printed. A failing block fails with its traceback."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               PRIVDL_DATA_DIR=str(SHARED_DATA), OMP_NUM_THREADS="1")  # one thread, as the other tests run
    res = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(python_blocks(page)), text=True,
                         capture_output=True, cwd=cwd, env=env, timeout=600)
    assert res.returncode == 0, f"{page.relative_to(ROOT)}:\n{res.stderr[-4000:]}"
    return res.stdout


def _mnist_present() -> bool:
    return (SHARED_DATA / "mnist").is_dir()


def _concepts(printed: str) -> None:
    """The library example: a Whisper ledger at agent level, the transcript's tags, the keyed draws' promise."""
    assert "DP per agent, agent level" in printed and "'theta'" in printed and "'y'" in printed
    assert printed.splitlines()[0] == "4 [1.0, 1.0, 1.0, 1.0]"
    assert "[4.0, 2.0, 4.0, 2.0]" in printed and printed.count("True") == 2 and "6.77" in printed


def _attack(printed: str) -> None:
    """The gradient-inversion example, as printed: right labels, recognisable digits."""
    import torch

    from privdl.tasks import make_task

    task = make_task("sigmoid_cnn", 5, data_dir=str(SHARED_DATA), dtype=torch.float64)
    labels, psnr = printed.strip().split("] [")
    assert labels + "]" == str(task.y.reshape(-1)[:4].long().tolist())  # agent 0's first four digits
    assert min(float(v) for v in psnr.rstrip("]").split(",")) > 30


def _extending(printed: str) -> None:
    """The plug-in examples: the new algorithm and mechanism run and state their privacy."""
    assert "heavy_ball" in printed and "laplace_ldp" in printed and "pure DP" in printed


#: what a page's blocks print that its text promises, and what each needs (None: nothing outside the repository)
def _said(printed: str, want: str) -> None:
    assert printed.strip() == want, printed


CHECKS = {
    "docs/concepts.md": (_concepts, None),
    "docs/recipes/dual-protection.md": (_attack, _mnist_present),
    "docs/extending.md": (_extending, None),
    "docs/recipes/time-varying-graphs.md": (lambda out: _said(out, "3 5.0\nTrue 4"), None),
}
#: pages whose blocks take minutes on 2 cores (iDLG's 300 L-BFGS iterations on the CNN), or that the fast tier runs
#: already with checks of their own (the tutorial: tests/test_own_data_doc.py): the slow tier runs them here
SLOW_PAGES = {"docs/recipes/dual-protection.md", "docs/own-data.md"}


def test_the_checked_pages_hold_python_blocks_and_no_other_fence_hides_python():
    """A page named in CHECKS lost its code, or a block meant to run is fenced as something else: fail."""
    with_code = {str(p.relative_to(ROOT)) for p in PAGES if python_blocks(p)}
    assert set(CHECKS) <= with_code, set(CHECKS) - with_code
    for page in PAGES:
        for fence in re.findall(r"^```(\w*)", page.read_text(), re.MULTILINE):
            assert fence.lower() not in ("py", "python3", "pycon"), (page, fence)


@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if str(p.relative_to(ROOT)) in SLOW_PAGES else p
    for p in PAGES if python_blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_of_a_page_runs(page, tmp_path):
    check, needs = CHECKS.get(str(page.relative_to(ROOT)), (None, None))
    if needs is not None and not needs():
        pytest.skip(f"{page.name} reads the shared data (not present under {SHARED_DATA})")
    printed = run_blocks(page, tmp_path)
    if check is not None:
        check(printed)


def _nav_pages() -> list[str]:
    """The .md files mkdocs.yml's nav names (mkdocs.yml is read as text: the test needs no YAML parser)."""
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:")[1]
    return re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.MULTILINE)


def test_the_site_nav_names_every_page_and_only_pages_that_exist():
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), nav
    missing = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing, f"nav names pages that do not exist: {missing}"
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if not p.is_relative_to(DOCS / "reproduction")}
    assert pages <= set(nav), f"pages left out of the nav: {sorted(pages - set(nav))}"
    for name in ("plugins.md", "own-data.md", "CONFIG.md", "cli.md", "concepts.md", "getting-started.md",
                 "extending.md", "benchmarks.md", "reproduction.md"):
        assert name in nav, name


def test_the_reference_has_a_page_per_main_room_and_the_included_files_exist():
    for room in ("privacy", "mechanisms", "algorithms", "network", "tasks", "experiment"):
        assert f"::: privdl.{room}" in (DOCS / "reference" / f"{room}.md").read_text(), room
    for page in DOCS.rglob("*.md"):
        for included in re.findall(r'^--8<-- "([^":]+)', page.read_text(), re.MULTILINE):
            assert (ROOT / included).is_file(), (page, included)


def test_the_readme_links_only_to_files_that_exist():
    readme = (ROOT / "README.md").read_text()
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    assert links and all((ROOT / t).exists() for t in links if t), [t for t in links if t and not (ROOT / t).exists()]
    assert len(readme.splitlines()) < 150


def test_every_shipped_config_is_valid():
    """Every example and packaged reproduction config loads and expands (keys, names and choices checked) — no
    data is read."""
    from privdl.experiment.config import expand, load_config

    root = Path(__file__).resolve().parents[1]
    paths = [*sorted((root / "examples").glob("*.toml")),
             *sorted((root / "src/privdl/reproductions/configs").glob("*.toml"))]
    assert len(paths) >= 15
    for path in paths:
        cfg = load_config(path, validate=False)
        if path.stem == "table2":  # a base that `privdl reproduce table2` completes with Table 1's cells
            cfg["sweep"]["cell"] = load_config(path.with_name("table1.toml"), validate=False)["sweep"]["cell"]
            cfg["sweep"]["cell"] = [c for c in cfg["sweep"]["cell"] if not c["label"].startswith("central")]
        if path.stem.startswith("designs_"):  # `privdl reproduce designs` runs the designs this privdl registers
            from privdl.reproductions.designs import registered

            cfg["sweep"]["method"] = registered(cfg["sweep"]["method"])[0]
        runs, _ = expand(cfg)
        assert runs, path


def test_every_cli_option_has_help_text():
    import typer.main

    from privdl.cli import app

    cmd = typer.main.get_command(app)
    missing = [f"{name} {p.opts}" for name, sub in cmd.commands.items() for p in sub.params
               if not getattr(p, "help", None)]
    assert not missing, missing


def test_boolean_flags_show_no_value_in_help():
    """`--no-plot` is a flag: its help must not suggest a value (typer alone prints ``<bool>``)."""
    from typer.testing import CliRunner

    import typer.main

    from privdl.cli import app

    names = [None, *typer.main.get_command(app).commands]
    for name in names:
        out = CliRunner().invoke(app, ([name] if name else []) + ["--help"], env={"COLUMNS": "200"}).output
        assert "--help" in out, (name, out)
        assert "<bool>" not in out, (name, out)
