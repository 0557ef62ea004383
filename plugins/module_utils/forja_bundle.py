# Copyright: forja contributors
# Apache-2.0
"""forja_bundle's work: a reproducible, secret-free tarball of controller folders.

Why here: the forja_bundle action plugin runs it inside Ansible's process on the controller (the
folders are there, and no module needs shipping), and it is plain Python that tests can call.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile

try:  # in Ansible by FQCN; forja's controller loads the sibling by path (forja/module_utils.py)
    from ansible_collections.forja.gpu.plugins.module_utils.forja_files import is_excluded, walk
except ImportError:
    from forja_files import is_excluded, walk  # type: ignore[no-redef]

MANIFEST = ".forja-bundle"

# forja_bundle's options (its DOCUMENTATION says what each means).
ARGUMENT_SPEC: dict[str, dict] = {
    "sources": {"type": "list", "elements": "dict", "required": True},
    "excludes": {"type": "list", "elements": "str", "default": []},
    "detect_secrets": {"type": "bool", "default": True},
    "dest": {"type": "path", "required": True},
    "required": {"type": "list", "elements": "str", "default": []},
    "required_executable": {"type": "list", "elements": "str", "default": []},
    "verify_only": {"type": "bool", "default": False},
}


class BundleError(Exception):
    """An input the bundle cannot be made from: the message names the option and the fix."""


def collect(
    sources: list[dict], patterns: list[str], detect: bool, why: dict[str, str] | None = None
) -> tuple[list, list, list]:
    """Walk the sources (forja_files: the same rules as the dataset push); return (files as
    (archive name, path, executable)), excluded, secrets, each named prefix/relative/path.
    `why`, when given, gets why each excluded path was left out (the pattern, the kind of key)."""
    files: list[tuple[str, str, bool]] = []
    excluded: list[str] = []
    secrets: list[str] = []
    for src in sources:
        prefix = src["prefix"].strip("/")
        found = walk(src["path"], patterns, detect)
        files += [(f"{prefix}/{item.rel}", item.path, item.executable) for item in found.files]
        excluded += [f"{prefix}/{rel}" for rel in found.excluded]
        secrets += [f"{prefix}/{rel}" for rel in found.secrets]
        if why is not None:
            why.update({f"{prefix}/{rel}": reason for rel, reason in found.why.items()})
    files.sort()
    return files, excluded, secrets


def missing_required(
    required: list[str],
    files: list[tuple[str, str, bool]],
    secrets: list[str],
    sources: list[dict],
    patterns: list[str],
    executable: list[str],
    why: dict[str, str] | None = None,
) -> list[str]:
    """Why each required archive path is not packed (empty when all are), naming what left it out;
    and why each of `executable` (also required) would not run: a hook without its x bit."""
    packed = {name: runs for name, _path, runs in files}
    problems = []
    runnable = {e.strip("/") for e in executable}
    for want in dict.fromkeys(w.strip("/") for w in [*required, *executable]):
        if want in packed:
            if want in runnable and not packed[want]:
                src = next((s for s in sources if want.startswith(s["prefix"].strip("/") + "/")), None)
                rel = want[len(src["prefix"].strip("/")) + 1 :] if src else want
                problems.append(f"{want}: {rel} is not executable; make it so (chmod +x {rel}, in "
                                f"{src['path'] if src else 'its folder'})")
            continue
        src = next((s for s in sources if want.startswith(s["prefix"].strip("/") + "/")), None)
        where = os.path.join(src["path"], want[len(src["prefix"].strip("/")) + 1 :]) if src else want
        if want in secrets:
            kind = (why or {}).get(want, "its content looks like a private key")
            problems.append(f"{want}: {kind}, so it is never sent")
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
    manifest = json.dumps({"files": [name for name, _path, _runs in files]}, indent=1).encode()
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


def bundle(params: dict, check_mode: bool) -> dict:
    """Pack `params` (forja_bundle's options, validated); return forja_bundle's result.

    Raises BundleError for a source that is not a folder or a required file the bundle would lack.
    """
    sources = params["sources"]
    for i, src in enumerate(sources):
        if not isinstance(src, dict) or not src.get("path") or not src.get("prefix"):
            raise BundleError(f"sources[{i}]: needs 'path' (a controller folder) and 'prefix' (a name)")
        if not os.path.isdir(os.path.expanduser(src["path"])):
            raise BundleError(f"sources[{i}].path: {src['path']!r} is not a folder on the controller")
    why: dict[str, str] = {}
    files, excluded, secrets = collect(sources, params["excludes"], params["detect_secrets"], why)
    problems = missing_required(params["required"], files, secrets, sources, params["excludes"],
                                params["required_executable"], why)
    if problems:
        raise BundleError("the bundle would lack what the run needs: " + "; ".join(problems))
    summary = {"excluded": len(excluded), "excluded_sample": excluded[:20], "secrets_excluded": secrets,
               "secrets_why": [f"{path} ({why[path]})" for path in secrets], "files": len(files)}
    if params["verify_only"]:
        total = sum(os.path.getsize(path) for _name, path, _runs in files)
        return {"changed": False, "path": "", "name": "", "sha256": "", "sha1": "", "bytes": total,
                "size_human": human(total), **summary}

    dest = params["dest"]
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
        if changed and not check_mode:
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"changed": changed, "path": path, "name": name, "sha256": sha, "sha1": sha1.hexdigest(),
            "bytes": total, "size_human": human(total), **summary}
