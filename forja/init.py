"""`forja init`: a starting inventory for a real Google Cloud project, in the user's own folder.

Why: an installed forja (pipx, pip) has no clone to run from, and a clone's inventory/gcp_gpu.yml
works only from the clone and only with FORJA_GCP_PROJECT exported. `forja init` writes an inventory
that works from any folder, into ~/.config/forja/inventory (forja's default when no other is named:
forja.inventory.chosen) or `--dir`, from the options a user actually chooses:

    gcp_gpu.yml                 the source: forja.gpu.gcp_gpu over the project, with the settings of
                                the shipped inventory/gcp_gpu.yml (copied from it when init runs)
    group_vars/all/project.yml  the user's choices: project, zone, Spot, SSH path, bucket, key file
    group_vars/all/<shared>     links to the shipped inventory/group_vars/all/*.yml (how Ansible reaches
                                the VMs, the guest attributes, the demo trainer config): one home for
                                them, forja's, so an upgrade of forja changes them for this inventory too

Nothing is contacted: whether the credentials, project and quota are ready is `forja check`'s
question, and creating the VM `forja up`'s. A key file is stored as a path, never its content.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from forja import errors
from forja.paths import REPO_ROOT, user_inventory

#: Google's rule for a project ID (Resource Manager): 6 to 30 characters, lowercase letters, digits and
#: hyphens, starting with a letter and not ending with a hyphen.
PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,28}[a-z0-9]\Z")
PROJECT_RULE = ("6 to 30 characters: lowercase letters, digits and hyphens, starting with a letter and "
                "not ending with a hyphen (e.g. my-project-123)")
#: A Compute Engine zone name: region-letter (us-east1-d, europe-west4-a).
ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]\Z")
#: Cloud Storage's bucket-name rule (without dots' extra rules): 3 to 63 characters of lowercase
#: letters, digits, '-', '_' and '.', starting and ending with a letter or digit.
BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]\Z")
#: The SSH paths of the gcp_instance role (gcp_instance_ssh_mode).
SSH_MODES = ("iap", "direct")
DEFAULT_ZONE = "us-east1-d"
#: What init writes (and, with --force, replaces) besides the links.
SOURCE_NAME = "gcp_gpu.yml"
SETTINGS_NAME = "project.yml"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What the user chooses for a real Google Cloud project (`forja init`'s options).

    Args:
        project: the Google Cloud project ID (checked against Google's rule, `PROJECT_RULE`).
        zone: the VM's zone (gcp_instance_zone).
        spot: a Spot VM (cheaper, may be preempted; forja's runs resume).
        ssh: how Ansible reaches the VM: "iap" (through Google's IAP, no open SSH port) or "direct".
        bucket: a Cloud Storage bucket for checkpoints and datasets; None: none.
        credentials_file: a service-account JSON key; None: gcloud's application default credentials.
    """

    project: str
    zone: str = DEFAULT_ZONE
    spot: bool = False
    ssh: str = "iap"
    bucket: str | None = None
    credentials_file: Path | None = None

    def checked(self) -> Settings:
        """The settings with the key's path made absolute; ConfigError naming the option otherwise."""
        if not PROJECT_ID.match(self.project or ""):
            raise errors.ConfigError("--project", f"{self.project!r} is not a Google Cloud project ID: "
                                                  f"a project ID is {PROJECT_RULE}. Copy it from the "
                                                  "console's project picker (the ID, not the name)")
        if not ZONE.match(self.zone or ""):
            raise errors.ConfigError("--zone", f"{self.zone!r} is not a Compute Engine zone (e.g. "
                                               f"{DEFAULT_ZONE}: region, then '-' and a letter)")
        if self.ssh not in SSH_MODES:
            raise errors.ConfigError("--ssh", f"{self.ssh!r}: use iap (through Google's IAP, no SSH port "
                                              "open to the internet) or direct (to the VM's public IP)")
        if self.bucket is not None and not BUCKET.match(self.bucket):
            raise errors.ConfigError("--bucket", f"{self.bucket!r} is not a bucket name: 3 to 63 lowercase "
                                                 "letters, digits, '-', '_' or '.', starting and ending "
                                                 "with a letter or digit")
        key = self.credentials_file
        if key is not None:
            key = Path(key).expanduser().resolve()
            if not key.is_file():
                raise errors.ConfigError("--credentials-file", f"{key} is not a file; give the path of a "
                                                               "service-account JSON key")
        return Settings(project=self.project, zone=self.zone, spot=self.spot, ssh=self.ssh,
                        bucket=self.bucket, credentials_file=key)


@dataclass(frozen=True)
class Written:
    """What `write` wrote: the inventory folder, its files and links, and what to run next."""

    folder: Path
    files: list[Path]
    links: list[Path]
    next_steps: list[str]
    #: Said to the user beside the next steps (a FORJA_INVENTORY that would win over this inventory...).
    notes: list[str] = field(default_factory=list)


def shared_vars(root: Path = REPO_ROOT) -> list[Path]:
    """The shipped group variables every real-GCP inventory uses (inventory/group_vars/all/*.yml)."""
    return sorted((root / "inventory" / "group_vars" / "all").glob("*.yml"))


def source(settings: Settings, root: Path = REPO_ROOT) -> dict[str, Any]:
    """The gcp_gpu source: the shipped inventory/gcp_gpu.yml's settings, over the user's project
    (and key, which the source needs as well as the roles: a plugin's config reads no variables)."""
    shipped = yaml.safe_load((root / "inventory" / SOURCE_NAME).read_text()) or {}
    data = {"plugin": shipped.pop("plugin", "forja.gpu.gcp_gpu"), "projects": [settings.project], **shipped}
    if settings.credentials_file is not None:
        data["credentials_file"] = str(settings.credentials_file)
    return data


def group_vars(settings: Settings) -> dict[str, Any]:
    """The user's choices as the roles' variables, each stated once: the other roles' project, key
    and bucket variables refer to these."""
    values: dict[str, Any] = {
        "gcp_instance_project": settings.project,
        "gcp_instance_zone": settings.zone,
        "gcp_instance_spot": settings.spot,
        "gcp_instance_ssh_mode": settings.ssh,
        "gcp_bucket_project": "{{ gcp_instance_project }}",
        "dataset_project": "{{ gcp_instance_project }}",
    }
    if settings.credentials_file is not None:
        values |= {"gcp_instance_credentials_file": str(settings.credentials_file),
                   "gcp_bucket_credentials_file": "{{ gcp_instance_credentials_file }}",
                   "dataset_credentials_file": "{{ gcp_instance_credentials_file }}"}
    if settings.bucket is not None:
        values |= {"gcp_bucket_name": settings.bucket,
                   "trainer_run_checkpoint_bucket": "gs://{{ gcp_bucket_name }}/checkpoints",
                   "dataset_bucket": "gs://{{ gcp_bucket_name }}"}
    return values


def _yaml(header: str, data: dict[str, Any]) -> str:
    lines = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return "---\n" + lines + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)


def write(settings: Settings, folder: Path | None = None, *, force: bool = False,
          root: Path = REPO_ROOT) -> Written:
    """Write a starting inventory for `settings` to `folder` (default ~/.config/forja/inventory).

    Raises ConfigError, with nothing written, when a setting breaks its rule or the folder already
    holds an inventory and `force` is not given. With `force`, init's own files are replaced and
    anything else in the folder is left as it is.
    """
    settings = settings.checked()
    target = Path(folder).expanduser().resolve() if folder is not None else user_inventory()
    shared = shared_vars(root)
    all_vars = target / "group_vars" / "all"
    ours = [target / SOURCE_NAME, all_vars / SETTINGS_NAME, *(all_vars / p.name for p in shared)]
    if target.exists() and not target.is_dir():
        raise errors.ConfigError("--dir", f"{target} is a file; name a folder for the inventory")
    shipped_inventories = (root / "inventory").resolve()
    if target.is_relative_to(shipped_inventories) or any(
            p.is_symlink() for p in (target / "group_vars", all_vars)):
        # --force replaces files there: never forja's own inventories, nor a folder linked to them
        raise errors.ConfigError("--dir", f"{target} is (or links into) forja's own inventories "
                                          f"({shipped_inventories}); name a folder of your own")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise errors.ConfigError("--dir", f"{target} already holds an inventory; nothing was written. "
                                          "Pass --force to replace forja init's files in it, or name "
                                          "another folder with --dir")
    all_vars.mkdir(parents=True, exist_ok=True)
    for path in ours:
        if path.is_symlink() or path.exists():
            path.unlink()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    (target / SOURCE_NAME).write_text(_yaml(
        f"Written by `forja init` ({when}): the VMs of Google Cloud project {settings.project} that forja\n"
        "manages (label forja=managed), as Ansible hosts of the group forja_gpu. The settings are those\n"
        f"of forja's inventory/gcp_gpu.yml; see `ansible-doc -t inventory forja.gpu.gcp_gpu`.",
        source(settings, root)))
    (all_vars / SETTINGS_NAME).write_text(_yaml(
        f"Written by `forja init` ({when}): your choices, as the roles' variables (see each role's\n"
        "defaults/main.yml). Edit freely; -e KEY=VALUE overrides them for one command. The other files\n"
        "here are links to forja's shared settings: leave them, `forja init --force` writes them again.",
        group_vars(settings)))
    links = []
    for shipped in shared:
        link = all_vars / shipped.name
        link.symlink_to(shipped.resolve())
        links.append(link)
    default = target == user_inventory()
    named = "" if default else f" -i {target}"
    next_steps = [f"forja{named} check", f"forja{named} up"]
    notes = []
    if settings.credentials_file is None:
        notes.append("No --credentials-file: forja uses your application default credentials "
                     "(gcloud auth application-default login) or FORJA_GCP_CREDENTIALS_FILE.")
    if settings.ssh == "iap" and shutil.which("gcloud") is None:
        notes.append("--ssh iap reaches the VM through gcloud's IAP tunnel, and gcloud is not on PATH: "
                     "install the Google Cloud CLI, or choose the direct path: forja init --force "
                     f"--project {settings.project} --ssh direct.")
    if default and os.environ.get("FORJA_INVENTORY"):
        notes.append(f"FORJA_INVENTORY is set ({os.environ['FORJA_INVENTORY']}): it wins over this "
                     "inventory; unset it to use this one.")
    return Written(target, [target / SOURCE_NAME, all_vars / SETTINGS_NAME], links, next_steps, notes)
