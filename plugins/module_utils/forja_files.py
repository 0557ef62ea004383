# Copyright: forja contributors
# Apache-2.0
"""What forja sends off the controller, and what it never sends: one walk, one rule for secrets.

The bundle (forja_bundle: the project a run executes) and the dataset push (forja_dataset: data
for a run) must leave out exactly the same things, so both walk folders here: exclude globs (a
name at any depth, or a relative path when the pattern has a slash; an excluded folder is not
descended into), symlinks and special files skipped, and files whose first bytes look like a
private key or a Google service-account key left out whatever they are called.

Standard library only: Ansible ships this file with the modules (AnsiballZ), and forja's Python
loads it by path with forja_dataset.py (forja/datasets.py), without importing Ansible.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass, field

#: How much of a file the secret sniffer reads: keys sit at the top of the files that hold them.
SNIFF_BYTES = 64 * 1024


def is_excluded(rel_path: str, name: str, patterns: list[str]) -> bool:
    """Name patterns match at any depth; patterns with a slash match the relative path."""
    for pat in patterns:
        target = rel_path if "/" in pat else name
        if fnmatch.fnmatchcase(target, pat.rstrip("/")):
            return True
    return False


def looks_like_secret(path: str) -> bool:
    """A private key or a service-account key, whatever the file is called."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return False
    if b"-----BEGIN" in head and b"PRIVATE KEY-----" in head:
        return True
    return b'"private_key"' in head and b'"service_account"' in head


@dataclass(frozen=True)
class Found:
    """One file that will be sent: its path relative to the walked folder, absolute path and stat."""

    rel: str
    path: str
    size: int
    mtime_ns: int
    executable: bool


@dataclass
class Walk:
    """What a walk kept, what it left out (an excluded folder once, with a trailing '/'), which of
    those were left out because they look like secrets, and folders it could not list."""

    files: list[Found] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


def walk(root: str, patterns: list[str], detect_secrets: bool) -> Walk:
    """Walk `root` (a folder) in a stable order, applying `patterns` and the secret sniffer.

    Paths in the result are relative to `root`, '/'-separated. A folder that cannot be listed is
    named in ``unreadable`` (the caller decides whether that is an error; a file that cannot be
    read fails whoever reads it).
    """
    found = Walk()
    root = os.path.realpath(os.path.expanduser(root))

    def on_error(exc: OSError) -> None:
        rel = os.path.relpath(exc.filename or root, root)
        found.unreadable.append("" if rel == "." else rel)

    for dirpath, dirnames, filenames in os.walk(root, onerror=on_error):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if is_excluded(rel, d, patterns) or os.path.islink(os.path.join(dirpath, d)):
                found.excluded.append(f"{rel}/")
            else:
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = f"{rel_dir}/{f}" if rel_dir else f
            full = os.path.join(dirpath, f)
            st = os.lstat(full)
            if not stat.S_ISREG(st.st_mode) or is_excluded(rel, f, patterns):
                found.excluded.append(rel)
            elif detect_secrets and looks_like_secret(full):
                found.excluded.append(rel)
                found.secrets.append(rel)
            else:
                executable = bool(st.st_mode & stat.S_IXUSR)
                found.files.append(Found(rel, full, st.st_size, st.st_mtime_ns, executable))
    found.files.sort(key=lambda item: item.rel)
    return found
