"""Every config key a user can set is documented in docs/CONFIG.md."""

from pathlib import Path

from privdl.experiment.config import INJECTED, NETWORK_FIXED, SECTIONS, TOP_LEVEL, builder_params
from privdl.network.topology import TOPOLOGIES

DOC = (Path(__file__).resolve().parents[1] / "docs" / "CONFIG.md").read_text()


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


def test_the_readme_library_example_runs():
    """The README's Python example, exactly as printed (a user copies it first)."""
    from tests.conftest import readme_python, run_printed

    printed = run_printed(readme_python("## The library"))
    assert "DP per agent, agent level" in printed and "'theta'" in printed and "'y'" in printed


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
