"""Declare, don't list (issue 45, item 5): an algorithm declares how it combines (``Algorithm.combines``) and what it
sends (``Algorithm.transmits``); the mechanisms that rest on W's linear mixing — whisper and decor (noise designed to
cancel in the mixing), zip_dl and muffliato (their averaging stands in for the one mix of the model per round) —
refuse an algorithm that does not declare it, with the reason, and run with every one that does. No mechanism or
attack keeps a table of algorithm names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from privdl.algorithms import ALGORITHMS, make_algorithm
from privdl.algorithms.base import Algorithm
from privdl.comm.base import COMBINATIONS, LINEAR_MIXING, MESSAGE_KINDS
from privdl.errors import ValidationError
from privdl.experiment import run_experiment
from privdl.experiment.config import expand

SRC = Path(__file__).resolve().parents[1] / "src" / "privdl"
BUILT_IN = sorted(ALGORITHMS.names())
MECHANISMS = {"whisper": {"epsilon": 10.0}, "decor": {"epsilon": 10.0}, "zip_dl": {"epsilon": 10.0},
              "muffliato": {"epsilon": 10.0}}


def _config(algorithm: str, mechanism: str) -> dict:
    return {"name": "declared", "iterations": 3, "seed": 0,
            "network": {"topology": "ring", "n": 6, "lazy": True},  # exact diffusion needs a positive-definite W
            "task": {"name": "quadratic"},
            "algorithm": {"name": algorithm}, "mechanism": {"name": mechanism, **MECHANISMS[mechanism]},
            "schedule": {"name": "constant", "eta": 0.05}}


def _accepts(alg: Algorithm, mechanism: str) -> bool:
    """What the declarations say: linear mixing for all four; one "model" message a round for zip_dl and muffliato."""
    if alg.combines != LINEAR_MIXING:
        return False
    return mechanism in ("whisper", "decor") or list(alg.transmits.values()) == ["model"]


def test_every_built_in_algorithm_declares_a_known_combination_and_message_kinds():
    for name in BUILT_IN:
        alg = make_algorithm(name)
        assert alg.combines in COMBINATIONS, name
        assert alg.transmits and set(alg.transmits.values()) <= set(MESSAGE_KINDS), name
    # read from the steps: comm.mix of the privatised quantity (adapt then combine) is linear mixing
    assert [n for n in BUILT_IN if make_algorithm(n).combines == LINEAR_MIXING] == [
        "dsg_rms", "dsgd", "dsgt", "dsgt_rms", "edsg_rms", "exact_diffusion", "sgp"]
    # combine then adapt (the gradient after the mix) and the authors' in-place gossip do not mix linearly
    assert make_algorithm("dsgd", form="cta").combines == "other"
    assert make_algorithm("dsgd", form="cta", gossip="authors").combines == "other"
    assert make_algorithm("dsgt", gossip="authors").combines == "other"


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
@pytest.mark.parametrize("algorithm", BUILT_IN)
def test_each_pair_runs_or_is_refused_as_the_algorithm_declares(tmp_path, algorithm, mechanism):
    cfg = _config(algorithm, mechanism)
    alg = make_algorithm(algorithm)
    if _accepts(alg, mechanism):
        summary = run_experiment(cfg, tmp_path, progress=False)
        assert summary.executed == 1
        return
    with pytest.raises(ValidationError) as err:
        run_experiment(cfg, tmp_path, progress=False)
    text = str(err.value)
    assert f"mechanism {mechanism!r}" in text and f"algorithm {algorithm!r}" in text, text
    if alg.combines != LINEAR_MIXING:
        assert f"declares combines = {alg.combines!r}" in text and "comm.mix" in text, text
    else:  # linear mixing, but not one model a round (trackers, exact diffusion's φ, obfuscated messages)
        assert "sends {" in text and "covers messages of kind model only" in text, text


def test_dsgd_in_its_forms_is_judged_by_what_each_form_declares(tmp_path):
    """The same name, other declarations: combine then adapt adds the noisy gradient after the mix, so whisper's
    noise would not cancel (the issue's test loss 1.7e4 against 7.3): refused, naming the declaration."""
    cfg = _config("dsgd", "whisper")
    cfg["algorithm"]["form"] = "cta"
    with pytest.raises(ValidationError, match="declares combines = 'other'"):
        run_experiment(cfg, tmp_path / "cta", progress=False)
    cfg["algorithm"]["form"] = "atc"
    assert run_experiment(cfg, tmp_path / "atc", progress=False).executed == 1


def _mine(combines: str, transmits: dict, name: str = "mine") -> Algorithm:
    """D-SGD's step under another name with the given declarations."""
    return make_algorithm("dsgd")._replace(name=name, combines=combines, transmits=transmits)


@pytest.mark.parametrize("combines,transmits,ok", [(LINEAR_MIXING, {"x": "model"}, True),
                                                   ("other", {"x": "model"}, False)])
def test_a_plug_in_algorithm_is_accepted_by_its_declaration_alone(tmp_path, combines, transmits, ok):
    """An algorithm privdl has never heard of (registered under a new name, as a plug-in does) runs with whisper and
    zip_dl through the config path when it declares linear mixing of one model, and is refused when it does not —
    in the runner (build) and in the engine (simulate, the library path) alike."""
    from privdl.experiment.build import build
    from privdl.simulator import simulate

    name = f"tests_declared_{combines}"
    ALGORITHMS.add(name, lambda: _mine(combines, transmits, name))
    try:
        for mechanism in ("whisper", "zip_dl"):
            cfg = _config(name, mechanism)
            out = tmp_path / mechanism
            if ok:
                assert run_experiment(cfg, out, progress=False).executed == 1
            else:
                with pytest.raises(ValidationError, match=f"algorithm {name!r} declares combines = 'other'"):
                    run_experiment(cfg, out, progress=False)
        c = build(expand(_config("dsgd", "whisper"))[0][0].config)
        run = lambda: simulate(task=c.task, network=c.network, algorithm=_mine(combines, transmits),  # noqa: E731
                               mechanism=c.mechanism, schedule=c.schedule, iterations=2, seed=0)
        if ok:
            assert torch.isfinite(run().final).all()
        else:
            with pytest.raises(ValidationError, match="needs an algorithm that combines by linear_mixing"):
                run()
    finally:
        ALGORITHMS._items.pop(name, None)


def _string_tuples_of_names(path: Path, names: set[str]) -> list[str]:
    """Tuples, lists, sets and dict keys of string constants in ``path`` that hold two or more algorithm names, or a
    one-element collection of one."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else (
            node.keys if isinstance(node, ast.Dict) else None)
        if not items:
            continue
        strings = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        hits = [s for s in strings if s in names]
        if hits and (len(hits) >= 2 or len(items) == 1):
            found.append(f"{path.relative_to(SRC)}:{node.lineno}: {hits}")
    return found


def test_no_mechanism_or_attack_keeps_a_table_of_algorithm_names():
    names = set(BUILT_IN) - {"central_sgd"}  # (a word the attacks' prose uses for the pooled baseline)
    found = [hit for room in ("mechanisms", "attacks") for path in sorted((SRC / room).glob("*.py"))
             for hit in _string_tuples_of_names(path, names)]
    assert not found, found
