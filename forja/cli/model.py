"""`forja model push RUN --repo NS/NAME`: the CLI side of `Forja.model_push` (parse, print).

It registers through forja/cli/common.py's `verb`, so the help is the API's docstring and errors
take the one error path. There is no option that takes the token itself: a command line is visible
to every user of the machine (ps) and lands in shell history.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from forja.api import Forja
from forja.cli.common import emit_json, forja_for, global_options, out, verb

commands = typer.Typer(name="model", help="Trained models: push one to the Hugging Face Hub.",
                       no_args_is_help=True)


@verb(Forja.model_push, "push", register=commands.command)
def push(
    ctx: typer.Context,
    run: Annotated[str, typer.Argument(help="Run name (its fetched results hold model/).")],
    repo: Annotated[str, typer.Option("--repo", help="Hub model repo: NAMESPACE/NAME.")],
    token_file: Annotated[
        Path | None, typer.Option("--token-file", help="File with the Hub token (mode 600); else $HF_TOKEN.")
    ] = None,
    private: Annotated[bool, typer.Option("--private", help="Make a new repo private.")] = False,
    folder: Annotated[
        Path | None, typer.Option("--folder", help="An exported model folder instead of the run's results.")
    ] = None,
) -> None:
    pushed = forja_for(ctx).model_push(run, repo, token_file=token_file, private=private or None,
                                       folder=folder)
    if global_options(ctx).json:
        emit_json(dataclasses.asdict(pushed))
    else:
        out.print(f"pushed {', '.join(pushed.files)} (step {pushed.step}) to {pushed.url} as {pushed.user}")
        out.print(f"commit {pushed.commit_url}")
