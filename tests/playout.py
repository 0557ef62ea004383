"""What ansible-playbook's default callback printed, read back by the tests that run playbooks as a user does.

One reader for the recap and the per-task results, so the drift tests and the sandbox's end-to-end
test agree on what "changed" means.
"""

from __future__ import annotations

import re


def recap(out: str) -> dict[str, dict[str, int]]:
    """The PLAY RECAP's counters by host: {"forja-l4": {"ok": 91, "changed": 0, ...}}."""
    found = {}
    for host, fields in re.findall(r"^(\S+)\s+: (ok=.*)$", out, flags=re.M):
        found[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", fields)}
    return found


def task_results(out: str) -> dict[str, str]:
    """Each task's name (role prefix and all) and what the callback printed for it."""
    blocks = re.split(r"^TASK \[(.+?)\] \**$", out, flags=re.M)
    return {blocks[i]: blocks[i + 1] for i in range(1, len(blocks) - 1, 2)}


def changed_tasks(out: str) -> list[str]:
    """The tasks that reported `changed` on some host (what to look at when a re-run changed things)."""
    return [name for name, text in task_results(out).items() if re.search(r"^changed: ", text, re.M)]
