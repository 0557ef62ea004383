"""`forja model push RUN --repo NS/NAME`: the CLI side of `Forja.model_push` (parse, print).

It registers through forja/cli/common.py's `verb`, so its help is its own (PUSH) and errors take the
one error path. There is no option that takes the token itself: a command line is visible
to every user of the machine (ps) and lands in shell history.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from forja.cli.common import Help, emit_json, forja_for, global_options, group, out, verb

commands = group("model", Help(
    "Trained models: push one to the Hugging Face Hub.",
    examples=("forja model push lr3 --repo alice/digits-cnn",),
    see_also=("forja fetch",),
), no_args_is_help=True)

PUSH = Help(
    "Push a run's exported model (model.safetensors and model.json) to a Hugging Face Hub model repo.",
    """The model is the one forja fetch NAME (or forja train) brought to this machine, in the run's
    results (model/), or the --folder given. This machine uploads it, not the VM: the token never
    leaves it. The token is read from --token-file (mode 600), else HF_TOKEN, else the one hf auth
    login saved; never from the command line, never logged. The repo is made when missing (--private
    makes a new one private). A token that cannot write to the repo is refused, naming the repo and how
    to get one that can, before anything is uploaded when the Hub says so up front.""",
    examples=(
        "forja model push lr3 --repo alice/digits-cnn",
        "forja model push lr3 --repo my-org/gpt-small --private --token-file ~/.config/hf-token",
        "forja model push lr3 --repo alice/digits-cnn --folder ./export/model",
    ),
    see_also=("forja fetch", "forja runs"),
)


@verb(PUSH, "push", register=commands.command)
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
