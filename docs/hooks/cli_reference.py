"""The CLI reference page, made from the `forja` command tree at every docs build.

Written by hand, a reference goes stale the day a flag changes; rendered from the commands
themselves it cannot. This walks the click tree that typer builds from `forja.cli.app` (groups,
their commands, each command's usage, help and options) and renders whatever help text is there,
as it is: the help is written for people in forja/cli, not here.

MkDocs runs it as a hook (mkdocs.yml `hooks:`), adding the page `cli.md` to the site without a file
on disk. `python docs/hooks/cli_reference.py` prints the same Markdown.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

#: The page's path in the site; mkdocs.yml's nav names it.
PAGE = "cli.md"


def _commands(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """Each command under `command` (itself first), depth first, with its own context: a group's
    subcommands are read through `list_commands`/`get_command`, which a lazily loaded group
    answers too."""
    yield command, ctx
    if not hasattr(command, "list_commands"):
        return
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        if sub is None or getattr(sub, "hidden", False):
            continue
        yield from _commands(sub, sub.context_class(sub, info_name=name, parent=ctx))


def _cell(text: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _fenced(text: str) -> list[str]:
    """Text shown as it is written, in a fence longer than any run of backticks inside it."""
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall(r"`+", text))])
    return [fence + "text", text, fence, ""]


def _section(command: Any, ctx: Any) -> str:
    """One command: its path as a heading, its usage, its help as written, its options."""
    path = ctx.command_path
    depth = path.count(" ")
    heading = "#" * max(2, min(1 + depth, 4))  # forja and its verbs ##, a group's commands ###
    lines = [f"{heading} `{path}`", "", *_fenced(f"{path} {' '.join(command.collect_usage_pieces(ctx))}")]
    help_text = (command.help or "").strip().replace("\b\n", "")  # click's no-rewrap mark
    if help_text:
        lines += _fenced(help_text)
    records = [r for r in (p.get_help_record(ctx) for p in command.get_params(ctx)) if r]
    if records:
        lines += ["| option | what it does |", "|---|---|"]
        lines += [f"| `{_cell(names)}` | {_cell(text)} |" for names, text in records]
        lines.append("")
    return "\n".join(lines)


def render() -> str:
    """The whole reference, in the order `forja --help` lists the commands."""
    import typer

    import forja.cli

    root = typer.main.get_command(forja.cli.app)
    ctx = root.context_class(root, info_name="forja")
    intro = ("# Command reference\n\nMade from the `forja` command itself at every docs build "
             "(`docs/hooks/cli_reference.py`): this is what `forja VERB --help` prints. The options of "
             "`forja` itself (`-i`, `-e`, `--json`, …) are in its own section, the first.\n")
    return "\n".join([intro, *(_section(c, x) for c, x in _commands(root, ctx))])


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated page to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files


if __name__ == "__main__":
    print(render())
