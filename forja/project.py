"""Which folder a run sends as "the project" when the user names none, and the git facts about it.

Why: the folder sent used to be the current directory, so `forja train trainer/configs/digits.yaml`
run from a forja clone (as the README shows) sent the whole clone, forja's tests and all: 624 files,
3.7 MiB, ten of them listed as keys (issue 32). What the user means is narrower:

- the folder they name (`--project`, or `Forja(project_dir=...)`) is the project;
- else a built-in config (one the trainer ships) needs no project at all: the trainer carries it;
- else the project of the config or script they gave: its git root, or, outside git, the current
  folder when it holds the file; else a script's own folder (a script runs from its project), and
  for a config nothing (its folder may be /tmp or a home folder: `--project` names one);
- never forja's own clone: a config there needs no project, a script there sends its own folder.

Standard library and ``git`` only (read with ``git -C``); a folder that is not a git repository,
or a machine without git, is simply not a git project.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import trainer

#: The trainer's own folder: a config inside it is built in (trainer/configs/*.yaml), sent with it.
TRAINER_DIR = Path(trainer.__file__).resolve().parent
#: forja's own source tree (a clone's root; in an installed copy, site-packages, never a git root).
FORJA_TREE = Path(__file__).resolve().parent.parent


def git(folder: Path, *args: str) -> str | None:
    """`git -C folder ARGS`'s stdout, or None when git fails (not a repository, no git)."""
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def git_root(folder: Path) -> Path | None:
    """The top of the git work tree that holds `folder`, or None outside one."""
    out = git(folder, "rev-parse", "--show-toplevel")
    return Path(out.strip()).resolve() if out and out.strip() else None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def default_project(config: Path | None, script: Path | None, cwd: Path) -> Path | None:
    """The project a run sends when the user named none (the module's docstring says the rule).

    `config` and `script` are absolute paths (a script relative to `cwd` made absolute first).
    """
    anchor = script or config
    if anchor is None:
        return None
    if script is None and _inside(anchor, TRAINER_DIR):
        return None  # a built-in config: the trainer carries it
    root = git_root(anchor.parent)
    if root is not None and root == FORJA_TREE.resolve():
        return None if script is None else anchor.parent
    if root is not None:
        return root
    if _inside(anchor, cwd) and cwd != FORJA_TREE.resolve():
        return cwd
    return anchor.parent if script is not None else None
