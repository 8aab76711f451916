"""Exceptions raised at privdl's boundaries (config, CLI, public functions).

Every error names the violated property and the offending value so a user can fix the input without reading code.
"""

from __future__ import annotations


class PrivdlError(Exception):
    """Base class of every error privdl raises on purpose."""


class ValidationError(PrivdlError, ValueError):
    """An argument violates a documented property (e.g. W not doubly stochastic, ε ≤ 0)."""


class ConfigError(PrivdlError, ValueError):
    """An experiment config is malformed: unknown key, wrong type, bad value. Names the key."""


class FileError(ValidationError, ConfigError):
    """A file privdl reads, or a folder it writes to, is missing, a folder where a file belongs (or the reverse),
    unreadable, empty, cut short, mis-encoded or of another kind. Names the file and what is wrong. The file is named
    by a config or an argument, so this is both a :class:`ConfigError` and a :class:`ValidationError`."""


class DataError(PrivdlError, OSError):
    """A data file is missing or corrupted (checksum). Says which file and where to put it."""


class UnknownNameError(ValidationError, KeyError):
    """A registry lookup failed; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""
