"""`forja up | configure | down`: the host's lifecycle, each verb one `Forja` method that runs playbooks.

Each prints the playbooks' recap table (or the result's JSON) through forja/cli/common.py.
"""

from __future__ import annotations

from typing import Annotated

import typer

from forja.api import Forja
from forja.cli.common import run_playbooks, verb

#: No name: its verbs are the root's own (`forja up`), registered in forja/cli/__init__.py.
commands = typer.Typer()


@verb(Forja.up, register=commands.command)
def up(ctx: typer.Context) -> None:
    run_playbooks(ctx, lambda f: f.up())


@verb(Forja.configure, register=commands.command)
def configure(ctx: typer.Context) -> None:
    run_playbooks(ctx, lambda f: f.configure())


@verb(Forja.down, register=commands.command)
def down(
    ctx: typer.Context,
    delete: Annotated[bool, typer.Option("--delete", help="Delete the VM instead of stopping it.")] = False,
) -> None:
    run_playbooks(ctx, lambda f: f.down(delete=delete))

