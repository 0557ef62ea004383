"""A copy of the checkout whose role and play tasks are all renamed (issue 13, part 1).

Renaming a task for wording must change nothing forja reads: forja takes what the roles publish
(set_stats, forja/contract.py), never a task's display name. The contract test (tests/contract, on
a test host) and the sandbox's end-to-end test both point forja at such a copy with FORJA_ROOT.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
PREFIX = "Renamed: "


def rename_tasks(tasks: Any) -> int:
    """Prefix the name of every task (blocks included); returns how many were renamed."""
    count = 0
    for task in tasks if isinstance(tasks, list) else []:
        if isinstance(task, dict):
            if isinstance(task.get("name"), str):
                task["name"] = PREFIX + task["name"]
                count += 1
            for key in ("block", "rescue", "always"):
                count += rename_tasks(task.get(key))
    return count


def renamed_copy(root: Path) -> Path:
    """Copy the checkout (tracked and untracked files, links kept) to `root`, renaming every task of
    roles/*/tasks and of the playbooks' own plays; returns `root`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, listed):
        src, dst = REPO / rel, root / rel
        if src.is_symlink() or src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst, follow_symlinks=False)
    link = root / "collections/ansible_collections/forja/gpu"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("../../..")
    renamed = 0
    for path in sorted(root.glob("roles/*/tasks/*.yml")):
        tasks = yaml.safe_load(path.read_text())
        renamed += rename_tasks(tasks)
        path.write_text(yaml.safe_dump(tasks, sort_keys=False, width=1000))
    for path in sorted(root.glob("playbooks/*.yml")):  # the plays' own tasks too: a stronger test
        plays = yaml.safe_load(path.read_text())
        for play in plays:
            for key in ("pre_tasks", "tasks", "post_tasks"):
                renamed += rename_tasks(play.get(key))
        path.write_text(yaml.safe_dump(plays, sort_keys=False, width=1000))
    assert renamed > 100, f"only {renamed} tasks renamed"
    return root
