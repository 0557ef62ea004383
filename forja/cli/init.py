"""`forja init --project ID`: the CLI side of `forja.init` (parse, write, print what to run next).

Not a `Forja` method: it writes the inventory that a `Forja` is then built on, and needs none itself;
it registers as every verb does (`verb`: its help, the one error path, `--json` after the verb).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from forja import init
from forja.cli.common import Help, emit_json, global_options, out, verb

commands = typer.Typer()

INIT = Help(
    "Write a starting inventory for your Google Cloud project, so forja works from any folder.",
    f"""Writes ~/.config/forja/inventory (or --dir DIR): gcp_gpu.yml, which lists your project's forja
    VMs, and group_vars/all/project.yml with your choices (project, zone, Spot, SSH path, bucket, key
    file), beside links to forja's shared settings. Without -i and FORJA_INVENTORY, forja then uses it
    by default. Nothing is contacted and no VM is made: run forja check, then forja up.

    Refuses to write over an existing inventory unless --force. A project ID is {init.PROJECT_RULE}.""",
    examples=(
        "forja init --project my-project-123",
        "forja init --project my-project-123 --spot --bucket my-project-123-forja",
        "forja init --project my-project-123 --ssh direct --dir ./inventory-direct",
    ),
    see_also=("forja check", "forja up"),
)


@verb(INIT, "init", register=commands.command,
      on_interrupt="cancelled; the inventory may be half written (run forja init --force)")
def init_command(
    ctx: typer.Context,
    project: Annotated[str, typer.Option("--project", help="Your Google Cloud project ID (not its name).")],
    zone: Annotated[str, typer.Option("--zone", help="Zone of the VM (one that offers the L4).")]
    = init.DEFAULT_ZONE,
    spot: Annotated[
        bool, typer.Option("--spot/--no-spot", help="A Spot VM: far cheaper, may be preempted (runs resume).")
    ] = False,
    ssh: Annotated[
        str, typer.Option("--ssh", help="How Ansible reaches the VM: iap (Google's IAP tunnel, no SSH port "
                                        "open; needs gcloud) or direct (the VM's public IP, opened to "
                                        "this machine's address only).")
    ] = "iap",
    bucket: Annotated[
        str | None, typer.Option("--bucket", help="A Cloud Storage bucket for checkpoints and datasets "
                                                  "(forja up creates it); default: none.")
    ] = None,
    credentials_file: Annotated[
        Path | None, typer.Option("--credentials-file", help="A service-account JSON key; its path is "
                                                             "stored, never its content. Default: your "
                                                             "application default credentials.")
    ] = None,
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Write the inventory here instead (use it with -i DIR).")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace the files of an earlier forja init.")
    ] = False,
) -> None:
    settings = init.Settings(project=project, zone=zone, spot=spot, ssh=ssh, bucket=bucket,
                             credentials_file=credentials_file)
    written = init.write(settings, folder, force=force)
    if global_options(ctx).json:
        emit_json(dataclasses.asdict(written))
        return
    out.print(f"wrote the inventory of project {project} to {written.folder}:")
    for path in [*written.files, *written.links]:
        out.print(f"  {path.relative_to(written.folder)}", soft_wrap=True)
    for note in written.notes:
        out.print(note, soft_wrap=True)
    out.print("Next:")
    out.print(f"  {written.next_steps[0]}    # are the credentials, project, APIs and GPU quota ready?",
              soft_wrap=True)
    out.print(f"  {written.next_steps[1]}       # create the VM", soft_wrap=True)
