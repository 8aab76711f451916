"""The command line's shared plumbing: the typer app and its command class (plain flags, overflow as an error),
the consoles, error and table output, the options several commands share (network, device), progress and warnings."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from privdl.errors import ValidationError

def _plain_flags(params: list) -> list:
    """Boolean flags take no value, so their help shows none (typer would print ``<bool>``)."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    return params


class _Command(TyperCommand):
    def get_params(self, ctx):  # noqa: D102 - typer hook
        return _plain_flags(super().get_params(ctx))

    def invoke(self, ctx):  # noqa: D102 - typer hook
        try:
            return super().invoke(ctx)
        except OverflowError as exc:  # e.g. --clip 1e300: its square is beyond double precision
            given = ", ".join(f"{k.rstrip('_')} = {v}" for k, v in ctx.params.items()
                              if v not in (None, False, [], ()))
            _fail(ValidationError(f"a value is too large to compute with in double precision ({exc}); given: "
                                  f"{given}"))


class _Group(TyperGroup):
    command_class = _Command

    def get_params(self, ctx):  # noqa: D102 - typer hook
        return _plain_flags(super().get_params(ctx))


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=_Group,
                  help="privdl: privacy-preserving decentralized learning (simulator, accountants, experiments).")
console = Console(width=None if sys.stdout.isatty() else 160)  # no truncated tables in logs
err = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        import privdl

        typer.echo(f"privdl {privdl.__version__} (source {privdl.source_hash()})")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print privdl's version and the hash of its source, and exit")) -> None:
    """privdl: privacy-preserving decentralized learning (simulator, accountants, experiments)."""


def _print_facts(facts: dict, fmt: "Format", title: str) -> None:
    """A flat dict of results as JSON or as a two-column table."""
    if fmt is Format.json:
        typer.echo(json.dumps(facts, indent=2, default=str))
        return
    table = Table(title=title)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for k, v in facts.items():
        table.add_row(k, "" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v)))
    console.print(table)


def _device(value: Optional[str]) -> Optional[str]:
    """--device: the values the config's ``device`` key takes (checked here, not deep inside torch)."""
    from privdl.experiment.config_schema import DEVICE

    if value is not None and not DEVICE.fullmatch(value):
        raise typer.BadParameter(f"must be cpu, cuda, cuda:N or auto, got {value!r}")
    return value


#: the graph options shared by the commands that build a network with :func:`_network` (typer reads an option's
#: declaration afresh for each command, so one declaration can serve several)
TOPOLOGY = typer.Option("erdos_renyi", "--topology", help="topology when no --mixing file is given")
EDGE_PROBABILITY = typer.Option(0.5, "--p", help="edge probability (erdos_renyi)")
GRAPH_SEED = typer.Option(0, "--graph-seed", min=0, help="seed of the random graph")
#: --plugin MODULE (repeatable): modules imported before any name is checked (privdl.plugins, docs/plugins.md)
PLUGIN = typer.Option([], "--plugin", help="import this module first, so the names it registers (algorithms, "
                                            "mechanisms, datasets, accountants, privacy events) can be used "
                                            "(repeatable; docs/plugins.md)")


def _load_plugins(names: list[str]) -> None:
    """Import the ``--plugin`` modules (and the installed ``privdl.plugins`` entry points)."""
    from privdl.plugins import load_plugins

    load_plugins(names)


def _network(mixing: Optional[Path], topology: str, n: int, p: float, graph_seed: int, rule: str,
             lazy: bool = False):
    """The network of a command's --mixing file, or of its --topology/--n/--p/--graph-seed/--rule options."""
    from privdl.network import Network, load_network_file

    if not 0.0 < p <= 1.0:  # checked whichever topology reads it: a value no topology could take is a typo
        raise ValidationError(f"--p is an edge probability in (0, 1], got {p}")

    if mixing is not None:
        return load_network_file(mixing, kind="mixing")
    return Network.from_topology(topology, n, mixing=rule, lazy=lazy, seed=graph_seed,
                                 **({"p": p} if topology == "erdos_renyi" else {}))


def _fail(exc: Exception) -> None:
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(str(exc))}")  # messages name [sections] and 'pkg[extra]' literally
    raise typer.Exit(code=2)


class Format(str, Enum):
    json = "json"
    table = "table"



def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line on stderr (each distinct message once), e.g. an RMS run outside seed 002's bounds."""
    from rich.markup import escape

    err.print(f"[yellow]warning:[/] {escape(str(message))}", soft_wrap=True, highlight=False)


def _progress_mode() -> "bool | Callable[[str], None]":
    """A live bar on a terminal; in a log, plain lines with counts and the time left (every 30 s)."""
    if sys.stdout.isatty():
        return True
    return lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)


def _progress_log() -> None:
    """Long builds (a network of 10⁶ agents) report their steps on stderr, one plain line each."""
    import logging

    class _Line(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            err.print(f"privdl: {record.getMessage()}", markup=False, highlight=False, soft_wrap=True)

    logger = logging.getLogger("privdl.network")
    if not logger.handlers:
        logger.addHandler(_Line())
        logger.setLevel(logging.INFO)
