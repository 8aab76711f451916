"""Plug-ins (issue 45, items 4 and 6): a config's ``plugins``, ``--plugin`` and the ``privdl.plugins`` entry points
import modules before any name is checked, so the one-file plug-in of docs/plugins.md — a dataset, a privacy event
type, an accountant, a mechanism and an algorithm — runs through ``privdl run`` with a sweep over one of its
mechanism's keys, on 2 processes (``--procs 2``: the workers import it too, from the config or from ``--plugin``),
and its runs re-account with ``privdl account --manifest``. A plug-in that fails to import is named with its error;
two plug-ins registering one name are refused, naming both; an unknown name is reported as such, with the valid
names, before any sweep key is checked.

The privdl commands run in subprocesses (the plug-in's folder on PYTHONPATH), as a user runs them, so that the
names it registers never enter this test process's registries."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import privdl.plugins as plugins
from privdl.algorithms import ALGORITHMS
from privdl.errors import ConfigError
from privdl.experiment.config import expand, load_config
from privdl.mechanisms import MECHANISMS
from privdl.plugins import PluginError, load_plugins

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "plugins.md").read_text()


def _block(lang: str, containing: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)
    return next(b for b in blocks if containing in b)


@pytest.fixture
def plugin(tmp_path):
    """The docs' plug-in as tmp_path/my_plugin.py and its config (fewer rounds) as tmp_path/my_plugin.toml."""
    (tmp_path / "my_plugin.py").write_text(_block("python", "@MECHANISMS.register"))
    cfg = _block("toml", 'plugins = ["my_plugin"]').replace("iterations = 100", "iterations = 20")
    (tmp_path / "my_plugin.toml").write_text(cfg)
    return tmp_path


def privdl(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(folder)])}
    return subprocess.run([sys.executable, "-m", "privdl.cli", *map(str, args)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


def _manifests(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/manifest.json"))]


def _rows(out: Path) -> list[tuple]:
    with open(out / "results.csv") as f:
        return sorted(tuple(v for k, v in r.items() if k != "run_id") for r in csv.DictReader(f))


@pytest.mark.slow  # worker processes (the slow tier)
def test_a_one_file_plug_in_runs_sweeps_on_processes_and_re_accounts(plugin):
    """The config route: plugins = ["my_plugin"]. Its dataset, algorithm and mechanism run, the sweep over the
    plug-in mechanism's sigma gives two ledgers of the plug-in's event kind accounted with its accountant; 2
    processes give the simulator's results; each manifest names the plug-in and re-accounts (verified)."""
    got = privdl(plugin, "run", "my_plugin.toml", "--out", "sim", "--no-plot", "--quiet")
    assert got.returncode == 0, got.stderr + got.stdout
    assert "4 runs (4 executed, 0 already done)" in " ".join(got.stdout.split())
    procs = privdl(plugin, "run", "my_plugin.toml", "--out", "procs", "--procs", "2", "--no-plot", "--quiet")
    assert procs.returncode == 0, procs.stderr + procs.stdout
    # the workers imported the plug-in and ran its parts: the simulator's numbers (to rounding: its dense mix)
    sim, dist = _rows(plugin / "sim"), _rows(plugin / "procs")
    assert [r[:-1] for r in dist] == [r[:-1] for r in sim]
    assert [float(r[-1]) for r in dist] == pytest.approx([float(r[-1]) for r in sim], rel=1e-9, abs=1e-12)
    manifests = _manifests(plugin / "sim")
    assert len(manifests) == 4
    by_sigma: dict[float, set] = {}
    for m in manifests:
        assert m["config"]["plugins"] == ["my_plugin"]
        assert m["config"]["algorithm"]["name"] == "heavy_ball" and m["config"]["task"]["dataset"] == "my_blobs"
        ledger = m["privacy_ledger"][0]
        assert ledger["accountant"] == "my_plugin.rdp_integer_orders"
        assert {e["kind"] for row in ledger["per_agent"] for e in row["events"]} == {"my_plugin.scaled_gaussian"}
        by_sigma.setdefault(m["config"]["mechanism"]["sigma"], set()).add(ledger["epsilon"])
    assert sorted(by_sigma) == [0.5, 2.0] and min(by_sigma[0.5]) > max(by_sigma[2.0]) > 0  # less noise, larger ε
    run = plugin / "sim" / "runs" / manifests[0]["run_id"] / "manifest.json"
    again = privdl(plugin, "account", "--manifest", run, "--format", "json")
    assert again.returncode == 0, again.stderr + again.stdout
    out = json.loads(again.stdout)
    assert out["verified"] is True and out["accountant"] == "my_plugin.rdp_integer_orders"
    assert out["epsilon"] == manifests[0]["privacy_ledger"][0]["epsilon"]
    # a manifest that does not name the plug-in: its event kind is unknown until --plugin imports it
    bare = json.loads(run.read_text())
    del bare["config"]["plugins"]
    (plugin / "bare.json").write_text(json.dumps(bare))
    unknown = privdl(plugin, "account", "--manifest", "bare.json", "--format", "json")
    said = " ".join(unknown.stderr.split())
    assert unknown.returncode == 2 and "'my_plugin.rdp_integer_orders'" in said and "--plugin MODULE" in said, said
    given = privdl(plugin, "account", "--manifest", "bare.json", "--plugin", "my_plugin", "--format", "json")
    assert given.returncode == 0 and json.loads(given.stdout)["epsilon"] == out["epsilon"], given.stderr


@pytest.mark.slow  # worker processes (the slow tier)
def test_the_plugin_flag_imports_it_in_the_workers_and_records_it(plugin):
    """The command-line route: a config without plugins, run with --plugin my_plugin on 2 processes; the runs'
    manifests record it, so account --manifest imports it without being told. Without the flag the plug-in's
    mechanism is an unknown name, reported with the valid names, before the sweep over its key."""
    cfg = (plugin / "my_plugin.toml").read_text().replace('plugins = ["my_plugin"]\n', "")
    (plugin / "bare.toml").write_text(cfg)
    missing = privdl(plugin, "run", "bare.toml", "--out", "none", "--no-plot", "--quiet")
    assert missing.returncode == 2
    text = " ".join(missing.stderr.split())
    assert "key 'task.dataset': unknown dataset 'my_blobs'; valid names: " in text, text
    assert "valid names:" in text and "sweep key" not in text
    got = privdl(plugin, "run", "bare.toml", "--out", "flag", "--plugin", "my_plugin", "--procs", "2", "--no-plot",
                 "--quiet")
    assert got.returncode == 0, got.stderr + got.stdout
    manifests = _manifests(plugin / "flag")
    assert len(manifests) == 4 and all(m["config"]["plugins"] == ["my_plugin"] for m in manifests)
    run = plugin / "flag" / "runs" / manifests[0]["run_id"] / "manifest.json"
    again = privdl(plugin, "account", "--manifest", run, "--format", "json")
    assert again.returncode == 0 and json.loads(again.stdout)["verified"] is True, again.stderr
    # the plug-in is not part of a run's identity: the config route gives the same run ids
    routed = privdl(plugin, "run", "my_plugin.toml", "--out", "flag", "--no-plot", "--quiet")
    assert routed.returncode == 0 and "4 runs (0 executed, 4 already done)" in " ".join(routed.stdout.split()), \
        routed.stderr + routed.stdout


# ---- bad input, in this process ---------------------------------------------------------------------------------
@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write modules into tmp_path (on sys.path); what they register is removed afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {r: dict(r._items) for r in (ALGORITHMS, MECHANISMS)}
    written: list[str] = []

    def write(name: str, text: str) -> str:
        (tmp_path / f"{name}.py").write_text(text)
        written.append(name)
        return name

    yield write
    for registry, items in before.items():
        registry._items.clear()
        registry._items.update(items)
    for name in written:
        sys.modules.pop(name, None)
        if name in plugins.LOADED:
            plugins.LOADED.remove(name)


REGISTERS = ("from privdl.algorithms import ALGORITHMS, make_algorithm\n\n"
             "@ALGORITHMS.register('tests_plugin_twice')\n"
             "def mine():\n    return make_algorithm('dsgd')\n")


def test_a_plugin_that_fails_to_import_is_named_with_its_error(modules):
    with pytest.raises(PluginError, match=r"plug-in 'tests_no_such_plugin' could not be imported: no module named "
                                          r"'tests_no_such_plugin'"):
        load_plugins(["tests_no_such_plugin"])
    modules("tests_plugin_raises", "raise RuntimeError('the lab server is down')\n")
    with pytest.raises(PluginError, match=r"plug-in 'tests_plugin_raises' could not be imported: RuntimeError: the "
                                          r"lab server is down"):
        load_plugins(["tests_plugin_raises"])
    modules("tests_plugin_needs", "import tests_missing_dependency\n")  # the plug-in is there; what it imports not
    with pytest.raises(PluginError, match=r"plug-in 'tests_plugin_needs' could not be imported: "
                                          r"ModuleNotFoundError: No module named 'tests_missing_dependency'"):
        load_plugins(["tests_plugin_needs"])
    for bad in ("not a module", "", "a..b", 3):
        with pytest.raises(ConfigError, match="is not a module name"):
            load_plugins([bad])


def test_two_plugins_registering_one_name_are_refused_naming_both(modules):
    modules("tests_lab_a", REGISTERS)
    modules("tests_lab_b", REGISTERS)
    load_plugins(["tests_lab_a"])
    with pytest.raises(PluginError) as err:
        load_plugins(["tests_lab_b"])
    text = str(err.value)
    assert "plug-in 'tests_lab_b' could not be imported" in text
    assert "algorithm 'tests_plugin_twice' is registered twice: by tests_lab_a.mine and by tests_lab_b.mine" in text
    # a plug-in taking a built-in's name is refused the same way
    modules("tests_lab_c", "from privdl.mechanisms import MECHANISMS\nfrom privdl.mechanisms.base import NoPrivacy\n"
                           "class Mine(NoPrivacy):\n    pass\nMECHANISMS.add('none', Mine)\n")
    with pytest.raises(PluginError, match=r"mechanism 'none' is registered twice: by privdl.mechanisms.base.NoPrivacy "
                                          r"and by tests_lab_c.Mine"):
        load_plugins(["tests_lab_c"])


def test_the_config_route_imports_before_any_name_is_checked(modules, tmp_path):
    modules("tests_plugin_mech", "from privdl.mechanisms import MECHANISMS\n"
                                 "from privdl.mechanisms.base import Clip\n"
                                 "class Clip2(Clip):\n    name = 'tests_clip2'\n"
                                 "MECHANISMS.add('tests_clip2', Clip2)\n")
    body = '[network]\ntopology = "ring"\n[schedule]\neta = 0.1\n[mechanism]\nname = "tests_clip2"\n[sweep]\n"mechanism.clip" = [0.5, 1.0]\n'
    cfg = tmp_path / "c.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError) as err:  # item 6: the name, not the sweep key, with the valid names
        load_config(cfg)
    assert "mechanism.name: unknown mechanism 'tests_clip2'; valid names: " in str(err.value)
    assert "whisper" in str(err.value) and "sweep key" not in str(err.value)
    cfg.write_text('plugins = ["tests_plugin_mech"]\n' + body)
    runs, axes = expand(load_config(cfg))
    assert axes == ["mechanism.clip"] and [r.config["mechanism"]["clip"] for r in runs] == [0.5, 1.0]
    assert all(r.config["plugins"] == ["tests_plugin_mech"] for r in runs)
    assert "tests_clip2" in MECHANISMS.names()  # and the valid names now list it
    # --plugin joins the config's list (each once); the plug-in is not part of a run's identity
    merged = load_config(cfg, plugins=["tests_plugin_mech", "json"])
    assert merged["plugins"] == ["tests_plugin_mech", "json"]
    assert [r.run_id for r in expand(merged)[0]] == [r.run_id for r in runs]
    for text, match in (('plugins = "tests_plugin_mech"\n', "must be a list of module names"),
                        ('plugins = ["tests_missing_plugin"]\n', "plug-in 'tests_missing_plugin' could not be "
                                                                 "imported"),
                        ('[sweep]\nplugins = [["json"], ["csv"]]\n', "plugins cannot be swept")):
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_config(cfg)


def test_an_unknown_dataset_is_reported_before_the_sweep_keys(tmp_path):
    """Item 6 for datasets: a misspelled dataset whose task keys a sweep sets names the dataset and the valid ones."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[task]\nname = "logistic"\ndataset = "breast_cancr"\n[sweep]\n"task.batch_size" = [8, 16]\n')
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    text = str(err.value)
    assert "'task.dataset': unknown dataset 'breast_cancr'; valid names: " in text and "breast_cancer" in text, text


def test_entry_points_of_the_group_are_imported_once(modules, monkeypatch):
    modules("tests_entry_plugin", "from privdl.algorithms import ALGORITHMS, make_algorithm\n"
                                  "ALGORITHMS.add('tests_entry_alg', lambda: make_algorithm('dsgd'))\n")
    point = importlib.metadata.EntryPoint("lab", "tests_entry_plugin", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "entry_point_plugins", lambda: [point])
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    monkeypatch.setattr(plugins, "LOADED", [])
    load_plugins([])
    assert "tests_entry_alg" in ALGORITHMS.names() and plugins.LOADED == ["privdl.plugins:lab"]
    load_plugins([])  # once per process
    assert plugins.LOADED == ["privdl.plugins:lab"]
    broken = importlib.metadata.EntryPoint("broken", "tests_no_such_entry", plugins.ENTRY_POINT_GROUP)
    monkeypatch.setattr(plugins, "entry_point_plugins", lambda: [broken])
    monkeypatch.setattr(plugins, "_entry_points_loaded", False)
    with pytest.raises(PluginError, match=r"plug-in 'tests_no_such_entry' \(entry point 'broken' of group "
                                          r"'privdl.plugins'\) could not be imported: ModuleNotFoundError"):
        load_plugins([])
