"""Finding data files and checking their content (checksums of the uncompressed bytes).

Search order for a data root: the ``data_dir`` argument, ``$PRIVDL_DATA_DIR``, ``./data``, ``../shared/data``,
``~/.privdl/data``. Missing files raise :class:`DataError` naming the file and where to put it; corrupted files
(checksum mismatch) raise it too.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

from privdl.errors import DataError


def data_roots(data_dir: str | Path | None = None) -> list[Path]:
    roots: list[Path] = []
    if data_dir:
        roots.append(Path(data_dir))
    if os.environ.get("PRIVDL_DATA_DIR"):
        roots.append(Path(os.environ["PRIVDL_DATA_DIR"]))
    roots += [Path("data"), Path("../shared/data"), Path.home() / ".privdl" / "data"]
    return roots


def find_file(names: list[str], subdirs: list[str], what: str, data_dir: str | Path | None = None,
              extra_dirs: list[Path] | None = None) -> Path:
    """The first existing ``root/subdir/name`` (also ``.gz`` variants) or a DataError listing where it looked."""
    dirs = [r / s for r in data_roots(data_dir) for s in subdirs] + list(extra_dirs or [])
    for d in dirs:
        for name in names:
            for candidate in (d / name, d / (name + ".gz")):
                if candidate.is_file():
                    return candidate
    looked = ", ".join(str(d) for d in dirs)
    raise DataError(
        f"{what}: file {names[0]} (or {names[0]}.gz) not found. Looked in: {looked}. Put it in one of these "
        f"folders, e.g. {dirs[0] / names[0]}, or set PRIVDL_DATA_DIR (or the task's data_dir) to its root."
    )


def read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it ends in .gz."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise DataError(f"cannot read {path}: {exc} (corrupted or truncated file?)") from None


def check_digest(data: bytes, path: Path, *, sha256: str | None = None, md5: str | None = None) -> None:
    """Raise DataError if the uncompressed ``data`` does not have the expected digest."""
    if sha256 is not None:
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            raise DataError(f"checksum mismatch for {path}: sha256 of its content is {got}, expected {sha256}")
    if md5 is not None:
        got = hashlib.md5(data).hexdigest()
        if got != md5:
            raise DataError(f"checksum mismatch for {path}: md5 of its content is {got}, expected {md5}")
