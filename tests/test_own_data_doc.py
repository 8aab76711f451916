"""docs/own-data.md runs as printed: every ```python block in order, in one namespace, in a fresh folder; then its
```bash ``privdl account --manifest`` command re-accounts the run the tutorial saved."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from privdl.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "own-data.md"


def blocks(language: str) -> list[str]:
    """The fenced ``language`` blocks of the tutorial, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_the_tutorial_runs_as_printed_and_its_saved_run_reaccounts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = blocks("python")
    assert len(code) >= 8
    namespace: dict = {"__name__": "own_data"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for k, block in enumerate(code):
            exec(compile(block, f"{DOC.name} (python block {k + 1})", "exec"), namespace)
    printed = out.getvalue()
    result = namespace["result"]
    # the statements the tutorial makes
    assert "(BatchNorm1d) does not support per-example gradients" in printed
    assert result.ledger.unit == "example" and result.ledger.guarantee in printed
    assert max(r["epsilon"] for r in result.ledger.per_agent()) <= 3.0 + 1e-6
    assert result.final["test_accuracy"] > 0.5
    assert (tmp_path / "runs" / "own-data" / "manifest.json").is_file()
    commands = [line for block in blocks("bash") for line in block.splitlines() if line.startswith("privdl ")]
    assert commands == ["privdl account --manifest runs/own-data/manifest.json"]
    for command in commands:
        res = CliRunner().invoke(app, [*shlex.split(command)[1:], "--format", "json"])
        assert res.exit_code == 0, res.output
        again = json.loads(res.output)
        assert again["verified"] is True and again["epsilon"] == result.ledger.epsilon
