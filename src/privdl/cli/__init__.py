"""The ``privdl`` command line: run, plot, merge, account, covariance, attack, rms-bounds, reproduce, audit.

``privdl.cli.common`` holds the app and what the commands share; ``experiments`` and ``privacy`` register the
commands on it."""

from __future__ import annotations

from privdl.cli import experiments, keys, privacy  # noqa: F401  (register the commands)
from privdl.cli.common import _progress_log, _warning_line, app


def main() -> None:
    import warnings

    warnings.showwarning = _warning_line
    _progress_log()
    app()


__all__ = ["app", "main"]
