"""Every mutant of benchmarks/mutation.py still applies: its text is found exactly once in its file. Code that moves
(a refactor) would otherwise leave a mutant that the harness reports "NOT APPLIED" only when someone runs it, and
docs/MUTATION.md's count would describe code that is no longer there."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_mutant_text_is_found_once_in_its_file():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import mutation
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert len(mutation.MUTANTS) == len({m[0] for m in mutation.MUTANTS}), "two mutants share a name"
    assert mutation.stale(ROOT) == []
