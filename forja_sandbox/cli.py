"""`forja sandbox up | status | down`: the local sandbox cloud from the command line.

`up` starts the Compute emulator bound to local hosts; then the usual commands (`forja up`,
`forja configure`, `forja train`, …) work against it with its inventory named: `-i inventory/sandbox`
or `FORJA_INVENTORY=inventory/sandbox`.
`down` deletes every sandbox instance with its host and stops the emulator.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="The local sandbox cloud (Compute emulator + real local hosts).\n\n"
                  "\b\nExamples:\n  forja sandbox up\n  forja -i inventory/sandbox up\n  forja sandbox down",
                  no_args_is_help=True)
out = Console()


@app.command()
def up(as_json: Annotated[bool, typer.Option("--json", help="Print the endpoint as JSON.")] = False) -> None:
    """Start the sandbox cloud (idempotent).

    \b
    Examples:
      forja sandbox up
      forja sandbox up --json
      forja -i inventory/sandbox up    # then make its VM
    """
    from forja_sandbox import service, testhosts  # here: the help of every forja command loads this module

    try:
        endpoint = service.ensure_running()
    except (RuntimeError, testhosts.TestHostError) as exc:
        Console(stderr=True).print(f"[red]the sandbox did not start:[/red] {exc}")
        raise typer.Exit(1) from exc
    if as_json:
        out.print_json(json.dumps(endpoint))
    else:
        out.print(f"sandbox cloud up: Compute API at {endpoint['api_url']} (project {endpoint['project']})")
        out.print(f"next: {_next_steps()}", soft_wrap=True)


def _next_steps() -> str:
    """How to use the sandbox now: from a clone as its README says; from an installed forja (pipx,
    pip) with the inventory/sandbox it carries, by its absolute path (any folder)."""
    from forja.paths import REPO_ROOT, ansible_env

    if ansible_env():
        return f"export FORJA_INVENTORY={REPO_ROOT / 'inventory' / 'sandbox'}; forja up"
    return ("export FORJA_INVENTORY=inventory/sandbox; forja up"
            "  (or: ansible-playbook -i inventory/sandbox site.yml)")


@app.command()
def status(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Show whether the sandbox runs and which hosts its instances are bound to.

    \b
    Example:
      forja sandbox status --json
    """
    from forja_sandbox import service

    info = service.describe()
    if as_json:
        out.print_json(json.dumps(info))
        return
    out.print(f"emulator: {'running at ' + info['api_url'] if info['running'] else 'stopped'}")
    table = Table("instance", "host", "address", "up")
    for row in info["instances"]:
        table.add_row(row["instance"], row["host"], row["address"], "yes" if row["up"] else "no")
    out.print(table)


@app.command()
def down() -> None:
    """Delete every sandbox instance with its host, stop the emulator, remove its state.

    \b
    Example:
      forja sandbox down
    """
    from forja_sandbox import service

    service.destroy()
    out.print("sandbox cloud removed")
