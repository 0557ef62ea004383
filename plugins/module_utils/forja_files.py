# Copyright: forja contributors
# Apache-2.0
"""What forja sends off the controller, and what it never sends: one walk, one rule for secrets.

The bundle (forja_bundle: the project a run executes) and the dataset push (forja_dataset: data
for a run) must leave out exactly the same things, so both walk folders here: exclude globs (a
name at any depth, or a relative path when the pattern has a slash; an excluded folder is not
descended into), symlinks and special files skipped, and files that hold a private key or Google
credentials in a known format (`secret_kind`) left out whatever they are called, each with why.

Standard library only: Ansible ships this file with the modules (AnsiballZ), and forja's Python
loads it by path with forja_dataset.py (forja/datasets.py), without importing Ansible.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from dataclasses import dataclass, field

#: How much of a file the secret sniffer reads: keys sit at the top of the files that hold them.
SNIFF_BYTES = 64 * 1024


def is_excluded(rel_path: str, name: str, patterns: list[str]) -> bool:
    """Name patterns match at any depth; patterns with a slash match the relative path."""
    return excluded_by(rel_path, name, patterns) is not None


def excluded_by(rel_path: str, name: str, patterns: list[str]) -> str | None:
    """The first of `patterns` that leaves the path out (is_excluded's rule), or None."""
    for pat in patterns:
        target = rel_path if "/" in pat else name
        if fnmatch.fnmatchcase(target, pat.rstrip("/")):
            return pat
    return None


#: Markers that open a private key on a line of their own, with what each is called in a reason;
#: any other "-----BEGIN <ALGORITHM> PRIVATE KEY-----" line (PKCS#1, PKCS#8, EC, DSA) is a PEM key.
_KEY_LINES = (
    (b"-----BEGIN OPENSSH PRIVATE KEY-----", "an OpenSSH private key"),
    (b"-----BEGIN PGP PRIVATE KEY BLOCK-----", "a PGP private key"),
    (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", "a PEM private key (encrypted)"),
    (b"PuTTY-User-Key-File-", "a PuTTY private key"),
)
#: A Google credentials file (JSON): its `type` and the field that makes it a secret.
_GOOGLE_JSON = {
    "service_account": ("private_key", "a Google service-account key (JSON with a private_key)"),
    "authorized_user": ("refresh_token", "Google user credentials (JSON with a refresh_token)"),
    "external_account": ("credential_source", "a Google workload-identity credential (JSON)"),
}


def secret_kind(path: str) -> str | None:
    """What kind of key the file holds, as a reason for people ("an OpenSSH private key"), or None.

    Why by format and not by name or substring: a key file *is* the key (its marker opens a line,
    or the whole file is Google's credentials JSON), while source code that mentions one (a test
    with a PEM string literal, an emulator writing a service-account dict) only contains the words.
    Matching the words sent forja's own tests to the "looks like a key" list (issue 32).
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return None
    for line in head.splitlines():
        line = line.strip()
        for marker, kind in _KEY_LINES:
            if line.startswith(marker):
                return kind
        if line.startswith(b"-----BEGIN ") and line.endswith(b"PRIVATE KEY-----"):
            algorithm = line[len(b"-----BEGIN "):-len(b"PRIVATE KEY-----")].strip().decode("ascii", "replace")
            return f"a PEM {algorithm + ' ' if algorithm else ''}private key"
    if not head.lstrip().startswith(b"{"):
        return None
    try:
        data = json.loads(head)
    except ValueError:  # not JSON, or longer than the sniff: credentials files are a few KiB
        return None
    if isinstance(data, dict):
        needs, kind = _GOOGLE_JSON.get(str(data.get("type")), ("", ""))
        if needs and needs in data:
            return kind
    return None


def looks_like_secret(path: str) -> bool:
    """A private key or Google credentials, whatever the file is called (`secret_kind`)."""
    return secret_kind(path) is not None


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
    those were left out because they look like secrets, why each was left out (``why``: the
    pattern, "a symlink", or the kind of key), and folders it could not list."""

    files: list[Found] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)


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
            pattern = excluded_by(rel, d, patterns)
            if pattern is not None or os.path.islink(os.path.join(dirpath, d)):
                found.excluded.append(f"{rel}/")
                found.why[f"{rel}/"] = f"matches {pattern!r}" if pattern else "a symlink"
            else:
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            rel = f"{rel_dir}/{f}" if rel_dir else f
            full = os.path.join(dirpath, f)
            st = os.lstat(full)
            pattern = excluded_by(rel, f, patterns)
            regular = stat.S_ISREG(st.st_mode)
            kind = secret_kind(full) if regular and pattern is None and detect_secrets else None
            if not regular or pattern is not None:
                found.excluded.append(rel)
                found.why[rel] = (f"matches {pattern!r}" if pattern else
                                  "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file")
            elif kind is not None:
                found.excluded.append(rel)
                found.secrets.append(rel)
                found.why[rel] = f"its content is {kind}"
            else:
                executable = bool(st.st_mode & stat.S_IXUSR)
                found.files.append(Found(rel, full, st.st_size, st.st_mtime_ns, executable))
    found.files.sort(key=lambda item: item.rel)
    return found
