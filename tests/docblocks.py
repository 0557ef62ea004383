"""The shell blocks of the README, SKILL.md and docs/, read as commands, so that tests can parse and run
what the docs tell people to type: a doc whose command has a misspelt option, or whose quick start no
longer works, fails a test instead of a reader.

A block is a fenced ```bash (or sh, shell, console) block. A block that a test runs is marked by an
HTML comment on the line just before its fence, which renders as nothing on GitHub and in the site:

    <!-- walk: sandbox -->
    ```bash
    forja up
    ```

`walk("sandbox")` is then the commands of every block so marked, in order (README.md first, then
docs/ by name). tests/sandbox/test_installed_walk.py runs the README's; tests/docs/ checks that every
`forja` command of every block parses against the real command tree.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: The marker of a block that a test runs: `<!-- walk: NAME -->` on the line before the fence.
MARKER = re.compile(r"<!--\s*walk:\s*([A-Za-z0-9_-]+)\s*-->")
FENCE = re.compile(r"^```(bash|sh|shell|console)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
#: What separates two commands on one line; a command is what lies between them.
SEPARATORS = frozenset({";", "&&", "||", "|", "&"})


@dataclass(frozen=True)
class Block:
    """One shell block: where it is (file and the line of its fence), its walk name if marked."""

    path: Path
    line: int
    walk: str | None
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """Every file whose shell blocks are people's instructions: the README, SKILL.md, docs/."""
    return [ROOT / "README.md", ROOT / "SKILL.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The shell blocks of one Markdown file, each with the walk name its marker gives, if any."""
    text = path.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        found.append(Block(path, text.count("\n", 0, match.start()) + 1,
                           marker.group(1) if marker else None, match.group(2)))
    return found


def commands(block: Block) -> list[list[str]]:
    """The block's simple commands as argv lists: comments dropped, `\\` continuations joined, a line
    split at `;`, `&&`, `||`, `|` and `&`. A `$ ` prompt (console blocks) is dropped."""
    found: list[list[str]] = []
    for line in block.text.replace("\\\n", " ").splitlines():
        line = line.removeprefix("$ ")
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        argv: list[str] = []
        for token in lexer:
            if token in SEPARATORS:
                found.append(argv)
                argv = []
            else:
                argv.append(token)
        found.append(argv)
    return [argv for argv in found if argv]


def forja_commands(block: Block) -> list[list[str]]:
    """The block's `forja` commands, each without the word `forja`."""
    return [argv[1:] for argv in commands(block) if argv[0] == "forja"]


def walk(name: str) -> list[list[str]]:
    """The `forja` commands of every block marked `<!-- walk: NAME -->`, in the docs' order."""
    return [argv for path in doc_files() if path.exists() for block in blocks(path) if block.walk == name
            for argv in forja_commands(block)]


class DocCommandError(Exception):
    """A documented command that the real `forja` would refuse: an unknown verb or option."""


def parse(root: Any, argv: list[str]) -> str:
    """Parse `forja ARGV` against the command tree `root` (typer.main.get_command(forja.cli.app))
    as the command would, running nothing (click's make_context parses and converts, a command's
    callback is never called), and return the command's path (`forja cost rate`). An unknown verb or
    option, a value of the wrong type, a required option left out or a stray argument raises
    DocCommandError with click's own words; a file named need not exist (no forja option demands it)."""
    args = list(argv)
    command, ctx, name = root, None, "forja"
    while True:
        try:  # not resilient_parsing: it would let an unknown option through
            ctx = command.make_context(name, args, parent=ctx)
        except Exception as exc:  # click's UsageError (NoSuchOption, MissingParameter, BadParameter)
            raise DocCommandError(f"forja {shlex.join(argv)}: {exc}") from exc
        if not hasattr(command, "resolve_command"):
            return ctx.command_path
        # A group keeps its subcommand's name apart: click has no public name for it.
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            return ctx.command_path
        try:
            name, command, args = command.resolve_command(ctx, rest)
        except Exception as exc:  # click's UsageError: no such command
            raise DocCommandError(f"forja {shlex.join(argv)}: {exc}") from exc
