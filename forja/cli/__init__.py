"""The `forja` command: a thin typer/rich shell over `forja.api.Forja`.

Every verb calls a `Forja` method, registered with `verb(Help(...), register=...)`: the command's
help is its own text for people, kept beside it in its part (what it does in the CLI's terms, its
examples, related verbs; the method's docstring stays the API's), `--json` is taken before or after
the verb, and every error takes one path (`exit_on_error`): a `ForjaError` prints its message (or one
JSON document under `--json`) and exits with its code. The commands only parse options, call the
method and print; the API loads when a command runs, never for `--help`. The help is click's plain
formatter (typer's `rich_markup_mode=None`): rich's panels took half of a verb's help time (0.1 s of
`forja train --help`), and plain text reads the same in a terminal and the docs' command reference.
Exit codes mean something
(see `ExitCode`): 0 ok, 1 a playbook task failed, 2 bad usage or input, 3 a host is unreachable,
4 cancelled, 5 not found, 6 the VM is stopped (the message says since when and why; `forja up`
starts it), 7 the command stopped following a run that goes on (`--timeout` expired, or Ctrl-C:
not a failure of the run).

Tables show numbers for people (`forja.format`: `0.008180`, `0.2¢`, `$0.71/h`, `2h 05m`);
`--json` prints the API's values at full precision.

The package in layers: forja/cli/common.py below (the global options, the error path, the printers,
`verb`, the `Forja` factory), one module per part above it (init, hosts, train, runs, live, cost, data,
model, vertex, zones), each importing common and never another part, and this module on top: the root
`app` with the global options, every part registered from the one list `PARTS`, so this stays the
single entry point (`forja = forja.cli:app`).
"""

from __future__ import annotations

import importlib.metadata
import json
import re
from typing import Annotated, Any

import typer

from forja.cli import cost, data, hosts, init, live, model, plan, queue, runs, sweep, train, vertex, zones
from forja.cli.common import EXIT_CODES_HELP, SUMMARY_SHOWN, Help, Options, RootGroup

__all__ = ["EXIT_CODES_HELP", "SUMMARY_SHOWN", "app"]

ABOUT = Help(
    "Reproducible GPU training hosts: provision, configure, train, fetch, stop.",
    "A Google Cloud VM with a GPU (or the local sandbox cloud), made and set up by Ansible, trains "
    "your model or your own script, follows the run, fetches its results and stops what is idle. "
    "Name the cloud with -i (or FORJA_INVENTORY, or write one with forja init). Every command "
    "prints one JSON document with --json, before or after its name.\n\n" + EXIT_CODES_HELP,
    examples=(
        "forja init --project my-project-123 --spot   # once: your project's inventory",
        "forja up && forja configure",
        "forja train trainer/configs/digits.yaml --name lr3",
        "forja runs --json",
        "forja -i inventory/sandbox status",
    ),
    see_also=("forja VERB --help", "forja --install-completion (tab completion for your shell)"),
)

app = typer.Typer(
    name="forja",
    help=ABOUT.render(),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=RootGroup,
    rich_markup_mode=None,  # click's plain help: the same text in a terminal and the docs, in half the time
)

#: What Ansible (and Python) accept as a variable name: a key with a space or a newline names nothing.
VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _parse_extravars(pairs: list[str]) -> dict[str, Any]:
    """`-e key=value` pairs; values are parsed as JSON when they look like JSON, else kept as text."""
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="--extra-var/-e")
        if not VARIABLE_NAME.match(key):  # Ansible would take it, and no role would ever read it
            raise typer.BadParameter(
                f"{key!r} is not a variable name (letters, digits and '_', not starting with a digit; "
                "e.g. trainer_run_wait_timeout_s=600)", param_hint="--extra-var/-e")
        try:
            parsed[key] = json.loads(value)
        except ValueError:
            parsed[key] = value
    return parsed


def _version(shown: bool) -> None:
    """`forja --version`: the installed package's version, then exit (before any other option)."""
    if shown:
        typer.echo(f"forja {importlib.metadata.version('forja')}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    inventory: Annotated[
        str | None,
        typer.Option("--inventory", "-i",
                     help="inventory/gcp_gpu.yml (Google Cloud) or inventory/sandbox (the local sandbox); "
                          "default: $FORJA_INVENTORY, else ~/.config/forja/inventory (forja init) when "
                          "it exists."),
    ] = None,
    limit: Annotated[
        str | None, typer.Option("--limit", "-l", help="Only these hosts (Ansible pattern).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document for scripts.")] = False,
    host_key_checking: Annotated[
        bool,
        typer.Option(
            "--host-key-checking/--no-host-key-checking",
            help="Verify SSH host keys (on by default; the sandbox's throwaway hosts turn it off).",
        ),
    ] = True,
    extra_var: Annotated[
        list[str] | None, typer.Option("--extra-var", "-e", help="KEY=VALUE passed to the playbooks "
                                       "(repeat it), e.g. -e gcp_instance_spot=true.")
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_version,
                           help="Print forja's version and exit.")
    ] = False,
) -> None:
    """The global options, parsed once for every command (its help is ABOUT's, the app's)."""
    ctx.obj = Options(
        inventory=inventory,
        limit=limit,
        json=as_json,
        host_key_checking=host_key_checking,
        extravars=_parse_extravars(extra_var or []),
    )


#: Every part's commands, in the order `forja --help` lists them. A part without a name (init, hosts,
#: train, runs, live) adds its verbs to the root (`forja up`); a named one is a group (`forja cost`).
PARTS: tuple[typer.Typer, ...] = (
    init.commands,
    hosts.commands,
    train.commands,
    plan.commands,
    runs.commands,
    live.commands,
    queue.commands,
    cost.commands,
    data.commands,
    model.commands,
    sweep.commands,
    vertex.commands,
    zones.commands,
)
for _part in PARTS:
    app.add_typer(_part)

# Commands that installed packages add through the `forja.cli` entry points: `forja sandbox` comes
# from the sandbox (pyproject.toml), which forja itself never imports. One that cannot be imported
# (the sandbox without its `sandbox` extra) is left out: the product runs without it.
for _entry in importlib.metadata.entry_points(group="forja.cli"):
    try:
        app.add_typer(_entry.load(), name=_entry.name)
    except ImportError:
        continue
