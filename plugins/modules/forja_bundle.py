#!/usr/bin/python
"""Ansible module forja_bundle: a reproducible, secret-free tarball of folders, built on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: forja_bundle
short_description: Pack folders into a content-addressed tarball, leaving secrets and junk out
description:
  - Packs one or more controller folders into a single C(.tar.gz) whose name is the SHA-256 of its content,
    so an unchanged project gives the same file and a later copy/unarchive reports no change.
  - The archive is reproducible - entries sorted, times, owners and gzip header zeroed, modes normalised to
    0644 or 0755 - so its hash depends on the file contents and names only.
  - Files and folders matching O(excludes) are skipped; with O(detect_secrets) files that look like private
    keys or service-account keys are skipped too, whatever their name, and reported.
  - The archive holds a C(.forja-bundle) manifest (JSON) listing what was packed; roles use it as the
    C(creates) marker when unpacking.
  - "Run it on the controller (C(delegate_to: localhost)); it never reads or writes on managed hosts."
version_added: "0.1.0"
author: forja
options:
  sources:
    description:
      - Folders to pack. Each item has C(path) (a folder on the controller) and C(prefix) (the folder it gets
        inside the archive). A missing folder is an error that names it.
    type: list
    elements: dict
    required: true
  excludes:
    description:
      - Glob patterns to leave out. A pattern without C(/) matches any file or folder name at any depth
        (C(.git), C(*.pem)); one with C(/) matches the path relative to the source folder (C(data/raw/*)).
        An excluded folder is not descended into.
    type: list
    elements: str
    default: []
  detect_secrets:
    description:
      - Also leave out files whose first 64 KiB contain a PEM private key or a Google service-account key.
    type: bool
    default: true
  dest:
    description:
      - Controller folder for bundles; created with mode 0700 when missing.
    type: path
    required: true
  required:
    description:
      - Archive paths (C(prefix/relative/path)) that must be in the bundle, such as the script a run executes.
      - One that is missing from its folder, or left out by O(excludes) or O(detect_secrets), fails the module
        before any bundle is written, with a message naming the file and why.
    type: list
    elements: str
    default: []
  verify_only:
    description:
      - Only walk the folders and check O(required), without building or writing an archive (a cheap check
        a role can make before it changes anything on a host). RV(path), RV(name) and RV(sha256) are empty.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Pack the trainer and the project
  forja.gpu.forja_bundle:
    sources:
      - {path: "{{ playbook_dir }}/../trainer", prefix: trainer}
      - {path: ~/my-project, prefix: project}
    excludes: [.git, .env, "*.pem", __pycache__]
    dest: ~/.cache/forja/bundles
    required: [project/train.py]  # the script the run executes must be sent
  delegate_to: localhost
  become: false
  register: bundle

- name: Say what will be sent
  ansible.builtin.debug:
    msg: "{{ bundle.files }} files, {{ bundle.size_human }}; {{ bundle.excluded }} left out"
"""

RETURN = r"""
path:
  description: Absolute path of the bundle on the controller.
  returned: always
  type: str
  sample: /root/.cache/forja/bundles/bundle-3f2a9c1d0b7e4a51.tar.gz
name:
  description: File name of the bundle.
  returned: always
  type: str
  sample: bundle-3f2a9c1d0b7e4a51.tar.gz
sha256:
  description: SHA-256 of the archive; its first 16 hex digits name the file.
  returned: always
  type: str
sha1:
  description:
    - SHA-1 of the archive, as ansible's copy module and P(forja.gpu.host_state#module) compute it, so a role
      can tell in one call whether the host already has this bundle.
  returned: always
  type: str
files:
  description: Number of files packed (the manifest not counted).
  returned: always
  type: int
  sample: 42
bytes:
  description: Total size of the packed files before compression.
  returned: always
  type: int
size_human:
  description: O(bytes) for people (KiB, MiB).
  returned: always
  type: str
  sample: 1.3 MiB
excluded:
  description: Number of files and folders left out (an excluded folder counts once).
  returned: always
  type: int
excluded_sample:
  description: Up to 20 of the paths left out, as C(prefix/relative/path).
  returned: always
  type: list
  elements: str
secrets_excluded:
  description: Paths left out because their content looks like a private key or a service-account key.
  returned: always
  type: list
  elements: str
"""

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_files import is_excluded, walk

MANIFEST = ".forja-bundle"


def collect(sources: list[dict], patterns: list[str], detect: bool) -> tuple[list, list, list]:
    """Walk the sources (forja_files: the same rules as the dataset push); return (files as
    (archive name, path, executable)), excluded, secrets, each named prefix/relative/path."""
    files: list[tuple[str, str, bool]] = []
    excluded: list[str] = []
    secrets: list[str] = []
    for src in sources:
        prefix = src["prefix"].strip("/")
        found = walk(src["path"], patterns, detect)
        files += [(f"{prefix}/{item.rel}", item.path, item.executable) for item in found.files]
        excluded += [f"{prefix}/{rel}" for rel in found.excluded]
        secrets += [f"{prefix}/{rel}" for rel in found.secrets]
    files.sort()
    return files, excluded, secrets


def missing_required(
    required: list[str],
    files: list[tuple[str, str, bool]],
    secrets: list[str],
    sources: list[dict],
    patterns: list[str],
) -> list[str]:
    """Why each required archive path is not packed (empty when all are), naming what left it out."""
    packed = {name for name, _, _ in files}
    problems = []
    for want in required:
        want = want.strip("/")
        if want in packed:
            continue
        src = next((s for s in sources if want.startswith(s["prefix"].strip("/") + "/")), None)
        where = os.path.join(src["path"], want[len(src["prefix"].strip("/")) + 1 :]) if src else want
        if want in secrets:
            problems.append(f"{want}: its content looks like a private key, so it is never sent")
        elif src is not None and not os.path.isfile(os.path.expanduser(where)):
            problems.append(f"{want}: {where} does not exist (or is not a file)")
        else:
            rel = want.split("/", 1)[1] if "/" in want else want
            parts = rel.split("/")
            hits = [
                pat
                for pat in patterns
                for i in range(len(parts))
                if is_excluded("/".join(parts[: i + 1]), parts[i], [pat])
            ]
            cause = f"the exclude pattern {hits[0]!r}" if hits else "a symlink or a special file"
            problems.append(f"{want}: left out by {cause}; change the excludes or move the file")
    return problems


def _info(name: str, size: int, executable: bool) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if executable else 0o644
    return info


def write_archive(files: list[tuple[str, str, bool]], out: io.BufferedIOBase) -> int:
    """Reproducible tar.gz of `files` plus the manifest; returns the packed byte count."""
    total = 0
    manifest = json.dumps({"files": [name for name, _, _ in files]}, indent=1).encode()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(_info(MANIFEST, len(manifest), False), io.BytesIO(manifest))
        for name, path, executable in files:
            size = os.path.getsize(path)
            total += size
            with open(path, "rb") as fh:
                tar.addfile(_info(name, size, executable), fh)
    return total


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "sources": {"type": "list", "elements": "dict", "required": True},
            "excludes": {"type": "list", "elements": "str", "default": []},
            "detect_secrets": {"type": "bool", "default": True},
            "dest": {"type": "path", "required": True},
            "required": {"type": "list", "elements": "str", "default": []},
            "verify_only": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    sources = module.params["sources"]
    for i, src in enumerate(sources):
        if not isinstance(src, dict) or not src.get("path") or not src.get("prefix"):
            module.fail_json(msg=f"sources[{i}]: needs 'path' (a controller folder) and 'prefix' (a name)")
        if not os.path.isdir(os.path.expanduser(src["path"])):
            module.fail_json(msg=f"sources[{i}].path: {src['path']!r} is not a folder on the controller")
    files, excluded, secrets = collect(sources, module.params["excludes"], module.params["detect_secrets"])
    problems = missing_required(module.params["required"], files, secrets, sources, module.params["excludes"])
    if problems:
        module.fail_json(msg="the bundle would lack what the run needs: " + "; ".join(problems))
    if module.params["verify_only"]:
        total = sum(os.path.getsize(path) for _, path, _ in files)
        empty = {"path": "", "name": "", "sha256": "", "sha1": ""}
        module.exit_json(
            changed=False, files=len(files), bytes=total, size_human=human(total), excluded=len(excluded),
            excluded_sample=excluded[:20], secrets_excluded=secrets, **empty,
        )  # fmt: skip

    dest = module.params["dest"]
    os.makedirs(dest, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bundle-", suffix=".tmp", dir=dest)
    try:
        with os.fdopen(fd, "wb") as out:
            total = write_archive(files, out)
        digest, sha1 = hashlib.sha256(), hashlib.sha1()  # ansible's own file checksum
        with open(tmp, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
                sha1.update(chunk)
        sha = digest.hexdigest()
        name = f"bundle-{sha[:16]}.tar.gz"
        path = os.path.join(dest, name)
        changed = not os.path.exists(path)
        if changed and not module.check_mode:
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    module.exit_json(
        changed=changed,
        path=path,
        name=name,
        sha256=sha,
        sha1=sha1.hexdigest(),
        files=len(files),
        bytes=total,
        size_human=human(total),
        excluded=len(excluded),
        excluded_sample=excluded[:20],
        secrets_excluded=secrets,
    )


if __name__ == "__main__":
    main()
