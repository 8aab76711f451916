"""Reading the files privdl is given, with an error that names the file and what is wrong with it.

Datasets: search order for a data root: the ``data_dir`` argument, ``$PRIVDL_DATA_DIR``, ``./data``,
``../shared/data``, ``~/.privdl/data``. Missing files raise :class:`DataError` naming the file and where to put it;
corrupted files (checksum mismatch) raise it too.

A user's own files — configs, mixing matrices W, covariances R, edge lists, manifests, experiment.json,
results.csv — are read by :func:`read_text`, :func:`read_json` and :func:`read_matrix`: a file that is missing, a
folder, unreadable, empty, cut short, not text (or text in an encoding other than UTF-8 / UTF-16 with a byte-order
mark) or of another kind (a .npz, an image, a pickle, …) raises :class:`FileError` with the file's path and what
was found instead.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from privdl.errors import DataError, FileError


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


# ---- a user's own files ------------------------------------------------------------------------------------------
#: what a file's first bytes say it is, for "of another kind" messages
MAGIC = (
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"PK\x03\x04", "a zip archive (a .npz of several arrays, a .zip, an .xlsx workbook)"),
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"\x89PNG", "a PNG image"),
    (b"%PDF", "a PDF document"),
    (b"\x80", "a Python pickle"),
    (b"SQLite format 3", "an SQLite database"),
    (b"\x7fELF", "an executable"),
    (b"\xd0\xcf\x11\xe0", "an old Microsoft Office document (.xls, .doc)"),
)
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
         (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def kind_of(data: bytes) -> str | None:
    """What the first bytes of ``data`` say it is (a .npy array, a zip archive, …), or None."""
    return next((kind for magic, kind in MAGIC if data.startswith(magic)), None)


def check_input(path: str | Path, what: str) -> Path:
    """``path`` as a Path if it names something readable that is not a folder, else a :class:`FileError` that says
    which (``what``: the file's role, e.g. "config file")."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise FileError(f"{what} {p} does not exist{_missing_hint(p)}") from None
    except NotADirectoryError:
        raise FileError(f"{what} {p} does not exist: {_file_above(p)} is a file, not a folder") from None
    except OSError as exc:
        raise FileError(f"{what} {p} cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise FileError(f"{what} {p} is a folder, not a file{_folder_hint(p)}")
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
        raise FileError(f"{what} {p} is a device or a socket, not a file")  # (a pipe, e.g. <(…), is read)
    return p


def _file_above(p: Path) -> Path:
    """The first path above ``p`` (or ``p``'s own start) that is a file, where a folder was needed."""
    for parent in reversed(p.parents):
        if parent.is_file():
            return parent
    return p


def _missing_hint(p: Path) -> str:
    folder = next((q for q in p.parents if q.exists()), None)
    if folder is not None and folder != p.parent:
        return f" (nor does its folder {p.parent})"
    return ""


def _folder_hint(p: Path) -> str:
    try:
        names = sorted(q.name for q in p.iterdir() if not q.name.startswith("."))
    except OSError:
        return ""
    if "experiment.json" in names:
        return f" (an experiment's output folder; the config it ran is in {p / 'experiment.json'})"
    if "manifest.json" in names:
        return f" (a run's folder; its manifest is {p / 'manifest.json'})"
    return f" (it holds {', '.join(names[:5])}{', …' if len(names) > 5 else ''})" if names else " (an empty one)"


def read_input(path: str | Path, what: str, *, empty: bool = False) -> bytes:
    """The bytes of a file a user gave privdl; a :class:`FileError` naming it if it is missing, a folder,
    unreadable, or (unless ``empty``) empty."""
    p = check_input(path, what)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise FileError(f"{what} {p} cannot be read ({exc.strerror or exc})") from None
    if not empty and not data.strip():
        raise FileError(f"{what} {p} is empty" + (f" ({len(data)} bytes of white space)" if data else ""))
    return data


def decode_text(data: bytes, path: str | Path, what: str) -> str:
    """``data`` as text: UTF-8 (a byte-order mark is dropped) or UTF-16/32 with a byte-order mark (what Windows
    editors and PowerShell's ``>`` write); anything else is a :class:`FileError` saying what the bytes are."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            try:
                return data[len(bom):].decode(codec)
            except UnicodeDecodeError as exc:
                raise FileError(f"{what} {path} starts with a {codec.upper()} byte-order mark but is not "
                                f"{codec.upper()} text (byte {exc.start + len(bom)}: {exc.reason})") from None
    kind = kind_of(data)
    if kind is not None:
        raise FileError(f"{what} {path} is {kind}, not text")
    if b"\x00" in data:
        at = data.index(b"\x00")
        line = data.count(b"\n", 0, at) + 1
        half = len(data) // 2
        if max(data[0::2].count(0), data[1::2].count(0)) > 0.4 * half:  # every other byte: ASCII in UTF-16
            raise FileError(f"{what} {path} is UTF-16 text without a byte-order mark (NUL bytes from line {line}): "
                            "save it as UTF-8")
        raise FileError(f"{what} {path} is not text: it holds a NUL byte at line {line} (binary data?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        where = f"byte 0x{data[exc.start]:02x} at line {line}, column {col}"
        if _binary(data):
            raise FileError(f"{what} {path} is not text but binary data ({where})") from None
        raise FileError(f"{what} {path} is not UTF-8 text: {where} (Latin-1 or Windows-1252? save it as UTF-8)") \
            from None
    return text


def _binary(data: bytes) -> bool:
    """Mostly bytes that no text file holds (control characters, or invalid UTF-8 everywhere)."""
    head = data[:4096]
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13))
    high = sum(1 for b in head if b >= 128)
    return control > len(head) // 100 or high > len(head) // 3


def read_text(path: str | Path, what: str, *, empty: bool = False) -> str:
    """The text of a file a user gave privdl (:func:`read_input`, then :func:`decode_text`)."""
    return decode_text(read_input(path, what, empty=empty), path, what)


def read_json(path: str | Path, what: str, *, kind: type = dict) -> Any:
    """A JSON file's content, which must be a ``kind`` (a JSON object by default); a :class:`FileError` naming the
    file if it is not JSON, is cut short, or holds another kind of value."""
    text = read_text(path, what)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text.rstrip()):
            raise FileError(f"{what} {path} ends before its JSON does (cut short? {exc.msg} at line {exc.lineno})") \
                from None
        raise FileError(f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") \
            from None
    except RecursionError:
        raise FileError(f"{what} {path} nests its JSON too deeply to be read") from None
    if not isinstance(value, kind):
        names = {dict: "a JSON object {…}", list: "a JSON list […]"}
        raise FileError(f"{what} {path} holds {_json_kind(value)}, not {names.get(kind, kind.__name__)}")
    return value


def _json_kind(value: Any) -> str:
    return {dict: "a JSON object", list: "a JSON list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def read_matrix(path: str | Path, what: str) -> np.ndarray:
    """The finite real numbers of a .npy file (any shape) or of a text table (.csv, .txt: one row per line,
    separated by commas or white space, ``#`` comments; a 2-d array), as float64. A :class:`FileError` names the
    file and says what is wrong: not a .npy although named so, another kind of file, objects or complex numbers,
    cut short, a cell that is not a number (its line and column), rows of different lengths, nan or ±inf."""
    p = Path(path)
    data = read_input(p, what)
    if data.startswith(b"\x93NUMPY"):
        arr = _npy(data, p, what)
    elif p.suffix.lower() == ".npy":
        kind = kind_of(data)
        raise FileError(f"{what} {p} is not a .npy file: it does not start with NumPy's header"
                        + (f"; it is {kind}" if kind else "; if it is text, name it .txt or .csv"))
    else:
        kind = kind_of(data)
        if kind is not None:
            raise FileError(f"{what} {p} is {kind}, not a matrix (give a .npy array, or numbers in .csv/.txt)")
        arr = _table(decode_text(data, p, what), p, what)
    if arr.size == 0:
        raise FileError(f"{what} {p} holds no numbers (an empty array of shape {arr.shape})")
    bad = ~np.isfinite(arr)
    if bad.any():
        at = tuple(int(k) for k in np.argwhere(bad)[0])
        where = f"row {at[0] + 1}, column {at[1] + 1}" if arr.ndim == 2 else f"entry {list(at)}"
        raise FileError(f"{what} {p}: {where} is {arr[at]} (every entry must be a finite number)")
    return arr


def _npy(data: bytes, path: Path, what: str) -> np.ndarray:
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
            raise FileError(f"{what} {path} holds Python objects (a pickled object array), not numbers: it is no "
                            "numeric .npy array") from None
        raise FileError(f"{what} {path} is not a readable .npy array: {exc} (cut short?)") from None
    except (EOFError, OSError) as exc:
        raise FileError(f"{what} {path} is cut short or damaged ({exc})") from None
    if not isinstance(arr, np.ndarray):
        raise FileError(f"{what} {path} does not hold one array")
    if arr.dtype.kind not in "biuf":
        kinds = {"c": "complex numbers", "U": "text", "S": "bytes", "V": "records (a structured array)",
                 "M": "dates", "m": "time spans", "O": "Python objects"}
        raise FileError(f"{what} {path} holds {kinds.get(arr.dtype.kind, arr.dtype)} ({arr.dtype}), not real "
                        "numbers")
    return arr.astype(np.float64)


def _table(text: str, path: Path, what: str) -> np.ndarray:
    """A text table of numbers: numpy's reader, and where it fails a line-by-line reading that finds the cell."""
    comma = "," in text
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data": said below, with the file's name
            arr = np.loadtxt(io.StringIO(text), delimiter="," if comma else None, ndmin=2, comments="#",
                             dtype=np.float64)
    except ValueError:
        arr = None
    rows: list[tuple[int, list[str]]] = []
    if arr is None or arr.size == 0:
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.split("#", 1)[0].strip()
            if line:
                rows.append((number, [c.strip() for c in line.split(",")] if comma else line.split()))
        if not rows:
            raise FileError(f"{what} {path} holds no numbers (only white space or # comments)")
    if arr is not None and arr.size:
        return arr
    width, first = len(rows[0][1]), rows[0][0]
    for number, cells in rows:
        for col, cell in enumerate(cells, start=1):
            if not _number(cell):
                shown = "empty" if cell == "" else f"{cell[:40]!r}, not a number"
                hint = (" (separated by semicolons? use commas or white space between numbers, and a point for "
                        "decimals)" if ";" in cell else " (a header line? remove it, or start it with #)"
                        if number == first and cell else "")
                raise FileError(f"{what} {path}, line {number}, column {col}: {shown}{hint}")
        if len(cells) != width:
            raise FileError(f"{what} {path}, line {number}: {len(cells)} number{'s' * (len(cells) != 1)}, but "
                            f"line {first} has {width} (every row of a matrix or an edge list has as many; cut "
                            "short?)")
    raise FileError(f"{what} {path} cannot be read as a table of numbers")


def _number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
