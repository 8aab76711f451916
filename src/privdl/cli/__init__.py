"""The ``privdl`` command line: run, plot, merge, account, covariance, attack, rms-bounds, reproduce, audit.

``privdl.cli.common`` holds the app and what the commands share; ``experiments`` and ``privacy`` register the
commands on it."""

from __future__ import annotations

from privdl.cli import experiments, keys, privacy  # noqa: F401  (register the commands)
from privdl.cli.common import _progress_log, _warning_line, app


def main() -> None:
    """The ``privdl`` command (console script and ``python -m privdl.cli``): privdl's process defaults first
    (:mod:`privdl.process_defaults`: huge pages, a short OpenMP spin — before any command imports torch; importing
    this package does not load it), then the command, then a quick exit (:func:`~privdl.process_defaults.
    before_exit`)."""
    import warnings

    from privdl.process_defaults import apply, before_exit

    apply()
    warnings.showwarning = _warning_line
    _progress_log()
    try:
        app()  # typer ends with SystemExit
    finally:
        before_exit()  # a quick exit of a process that loaded torch


__all__ = ["app", "main"]
