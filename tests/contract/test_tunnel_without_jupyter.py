"""The tunnel of a real host (th29) that has no Jupyter: forja says to configure it.

The data contract read from a tree whose every task is renamed (issue 13, part 1) is proven in the
site's end-to-end test on the test sandbox's VM
(tests/sandbox/test_site_e2e.py::test_a_tree_whose_tasks_are_all_renamed_still_drives_the_sandbox):
jupyter.yml and train_status.yml of the renamed copy, every task that ran renamed, their facts
checked field by field against forja's models, then `forja train`, `status` and `tunnel`; a port
other than 8888 by test_forja_tunnel_follows_a_jupyter_port_moved_with_e there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from apihosts import REPO, host_vars, write_inventory

from forja_sandbox import testhosts

pytestmark = [pytest.mark.hosts, pytest.mark.slow]
FORJA = Path(sys.executable).with_name("forja")


def test_the_tunnel_of_a_host_without_jupyter_says_to_configure_it(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    host = testhosts.up(29)
    try:
        inventory = write_inventory(tmp_path / "inventory.yml", {"th29": host_vars(host)})
        argv = [str(FORJA), "-i", str(inventory), "--no-host-key-checking", "--json", "tunnel", "--print"]
        proc = subprocess.run(argv, cwd=REPO, env={**os.environ, "FORJA_HOME": str(tmp_path / "home")},
                              capture_output=True, text=True, timeout=600, check=False)
    finally:
        testhosts.down(29)
    error = json.loads(proc.stdout)
    assert proc.returncode == 1 and error["host"] == "th29"
    assert "no Jupyter configuration" in error["message"] and "forja configure" in error["message"]
