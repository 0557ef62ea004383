"""One door into Ansible for the inventory: forja.inventory is the only reader of it in forja.

`forja cost`, `forja tunnel`, `Forja.hosts()` and the stopped-VM check all get plain values (no
`__ansible_unsafe` markers, no cached facts) because they all read through forja.inventory; a
second `ansible-inventory` call or `ansible_runner.get_inventory` elsewhere would bring back the
values that reader exists to clean.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: Ways into Ansible's inventory: ansible-runner's helper, the CLI, Ansible's own manager.
DOORS = re.compile(
    r"get_inventory\s*\(|[\"']ansible-inventory[\"']|_ansible_inventory\s*\(|InventoryManager\s*\("
)


def test_only_forja_inventory_reads_the_inventory():
    readers = sorted(
        path.relative_to(REPO).as_posix()
        for path in (REPO / "forja").rglob("*.py")
        if DOORS.search(path.read_text())
    )
    assert readers == ["forja/inventory.py"]


def test_there_is_one_cost_command():
    """`python -m forja.cost` is the main CLI's `forja cost`, not a second command with its own reader."""
    assert not (REPO / "forja/cost/cli.py").exists()
    assert "from forja.cli import app" in (REPO / "forja/cost/__main__.py").read_text()
