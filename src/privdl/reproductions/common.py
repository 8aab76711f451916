"""What every reproduction shares: the registry behind ``privdl reproduce NAME`` and CSV output."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable

from privdl.registry import Registry

REPRODUCTIONS: Registry[Callable[..., list[dict]]] = Registry("reproduction")


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))
