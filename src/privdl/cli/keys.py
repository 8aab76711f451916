"""``privdl keys generate``: Ed25519 identities for runs with ``runtime.identity = "ed25519"``."""

from __future__ import annotations

from pathlib import Path

import typer

from privdl.cli.common import _Command, _Group, _fail, app
from privdl.errors import PrivdlError

keys_app = typer.Typer(cls=_Group, no_args_is_help=True,
                       help="agent identities that authenticate the key agreement (runtime.identity = \"ed25519\")")
app.add_typer(keys_app, name="keys")


@keys_app.command(cls=_Command)
def generate(
    agents: int = typer.Option(..., "--agents", help="number of agents (ids 0 … N − 1)"),
    out: Path = typer.Option(..., "--out", help="folder for roster.json and identities/ (created)"),
) -> None:
    """Write DIR/roster.json (every agent's Ed25519 public key: give it to every host) and
    DIR/identities/agent-<i>.pem (each agent's private key, mode 0600: copy to each host only its agents' files).
    Then set runtime.identity = "ed25519", runtime.roster = "DIR/roster.json", runtime.identity_dir =
    "DIR/identities"."""
    from privdl.agreement.identity import generate as make

    try:
        roster, folder = make(agents, out)
    except PrivdlError as exc:
        _fail(exc)
    typer.echo(f"{agents} identities: roster {roster} (public), private keys in {folder}/agent-<i>.pem (mode 0600)")


__all__ = ["generate", "keys_app"]
