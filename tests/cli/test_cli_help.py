"""The `forja` command's help, written for people: every command's, read from the command tree that
typer builds (click's own `get_help`, in process), plus one fresh process that proves help needs no
API, no inventory, no venv activation and no network.

What is held here: each command shows at least one example, and every example is a command line
that `forja` parses (its verbs, flags and required values exist); no help names a Python object, a
parameter spelling or an exception class; `--json` is taken after the verb as before it, with the
same output; `forja --version`; and `import forja.cli` leaves the API unloaded, which is why help is
fast (bench/cli_help_bench.py times it)."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from forja.cli import app
from forja.errors import ExitCode
from forja.history import History

runner = CliRunner()

#: What only a Python caller should read: parameter spellings, API objects, exception classes, calls.
PYTHON_WORDS = {
    "a keyword argument (wait=False)": r"\b\w+=(False|True|None)\b",
    "the API object (Forja( or Forja.)": r"\bForja[(.]",
    "a module path (forja.vertex.X)": r"\bforja\.\w+\.",
    "an exception class": r"\b\w+Error\b|\bKeyboardInterrupt\b|\bHostStopped\b|\bCancelled\b",
    "a Python type (dict, list[str])": r"\bdicts?\b|\blist\[|\bNoneType\b|<(str|int|float|path)>",
    "a call (open())": r"\b\w+\(\)",
    "a parameter name with a unit suffix": r"\b(timeout_s|poll_s|hook_timeout_s|follow_window_s)\b",
    "a quoted keyword value": r"\w+=\"",
}


#: The command tree, as typer builds it for each invocation (built once here: it takes a while).
ROOT: Any = typer.main.get_command(app)


def commands() -> Iterator[tuple[str, Any, Any]]:
    """Every command of the tree (groups and their commands, `forja sandbox` when installed), with its
    path and its own context."""
    todo = [("forja", ROOT, ROOT.make_context("forja", [], resilient_parsing=True))]
    while todo:
        path, command, ctx = todo.pop(0)
        yield path, command, ctx
        for name in getattr(command, "list_commands", lambda _: [])(ctx):
            sub = command.get_command(ctx, name)
            todo.append((f"{path} {name}", sub, sub.context_class(sub, info_name=name, parent=ctx)))


ALL = list(commands())
HELP = {path: command.get_help(ctx) for path, command, ctx in ALL}


def examples(text: str) -> list[str]:
    """The command lines under a help's "Example:"/"Examples:" heading."""
    lines = text.splitlines()
    found: list[str] = []
    for i, line in enumerate(lines):
        if line.strip() in ("Example:", "Examples:"):
            for following in lines[i + 1:]:
                if not following.strip().startswith("forja"):
                    break
                found.append(following.strip())
    return found


def test_the_walk_reaches_groups_their_commands_and_the_sandbox() -> None:
    assert {"forja", "forja train", "forja cost", "forja cost rate", "forja queue move", "forja sweep status",
            "forja data push", "forja model push", "forja vertex cancel", "forja sandbox up"} <= set(HELP)


@pytest.mark.parametrize("path", sorted(HELP))
def test_every_command_shows_an_example_of_itself_and_no_python(path: str) -> None:
    text = HELP[path]
    shown = examples(text)
    assert any(e == path or e.startswith(path + " ") for e in shown), f"{path}: no example of it in\n{text}"
    named = {what: m.group(0) for what, rx in PYTHON_WORDS.items() if (m := re.search(rx, text))}
    assert not named, f"{path}'s help names {named}; say it in the command's terms (flags, files)"


def forja_commands(line: str) -> Iterator[list[str]]:
    """The `forja ...` commands of a shell line (`forja check --json | jq '...'`: the first), each as
    its words; quotes are the shell's, and `|`, `&&`, `;` end a command."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token in ("|", "||", "&&", ";"):
            if words and words[0] == "forja":
                yield words
            words = []
        else:
            words.append(token)


def _parse(argv: list[str]) -> str:
    """Parse a command line as `forja` does, without running it: each group's options and the chosen
    command's (flags, values, required ones). Returns the command's path; raises click's usage error."""
    command = ROOT
    ctx = command.make_context("forja", argv)
    path = "forja"
    while hasattr(command, "resolve_command") and ctx._protected_args:  # a group and its sub-command
        name, command, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        ctx = command.make_context(name, rest, parent=ctx)
        path += f" {name}"
    return path


@pytest.mark.parametrize("path", sorted(HELP))
def test_every_example_is_a_command_line_forja_parses(path: str) -> None:
    for example in examples(HELP[path]):
        for words in forja_commands(example.split("  #")[0]):  # a comment for people may follow
            _parse(words[1:])  # a usage error (no such option, a missing value) fails here


def test_every_verb_that_prints_takes_json_after_it() -> None:
    own = [(path, command) for path, command, _ in ALL
           if path != "forja" and not path.startswith("forja sandbox")]  # the sandbox's are its own
    missing = [path for path, command in own
               if (command.callback is not None or not hasattr(command, "commands"))
               and not any("--json" in p.opts for p in command.params)]
    assert not missing


def test_json_after_the_verb_is_json_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    History().start("digits-1", name="digits-1", hosts=["th6"])
    after, before = runner.invoke(app, ["runs", "--json"]), runner.invoke(app, ["--json", "runs"])
    assert after.exit_code == 0, after.output
    assert after.stdout == before.stdout and json.loads(after.stdout)[0]["run_id"] == "digits-1"
    instances = tmp_path / "instances.yml"
    instances.write_text(yaml.safe_dump([{"name": "forja-l4", "zone": "us-east1-d"}]))
    refused = runner.invoke(app, ["cost", "--instances", str(instances), "--scope", "everything", "--json"])
    assert refused.exit_code == ExitCode.USAGE and json.loads(refused.stdout)["field"] == "scope"


def test_version_is_the_installed_package() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"forja {importlib.metadata.version('forja')}\n"
    assert "--install-completion" in HELP["forja"] and "--show-completion" in HELP["forja"]


#: Run in a fresh Python: no network (a connection fails), then what `import forja.cli` and three
#: helps loaded of what makes the API slow to import.
FRESH = """
import json, socket, sys
def refuse(*args, **kwargs):
    raise OSError("help must not use the network")
socket.socket.connect = refuse
HEAVY = ("forja.api", "pydantic", "requests", "prometheus_client")
import forja.cli
loaded = {"import": [m for m in HEAVY if m in sys.modules]}
for argv in (["--help"], ["train", "--help"], ["cost", "rate", "--help"], ["queue", "move", "--help"]):
    try:
        forja.cli.app(argv, prog_name="forja")
    except SystemExit as exc:
        loaded[" ".join(argv)] = [exc.code, [m for m in HEAVY if m in sys.modules]]
print(json.dumps(loaded))
"""


def test_help_loads_no_api_and_needs_no_inventory_venv_or_network(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}  # no FORJA_INVENTORY, no venv activated
    proc = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.splitlines()[-1])
    assert loaded == {"import": [], "--help": [0, []], "train --help": [0, []], "cost rate --help": [0, []],
                      "queue move --help": [0, []]}
