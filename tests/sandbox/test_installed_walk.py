"""The installed forja drives a cloud from any folder: the wheel, installed into a venv outside the
clone (tests/sandbox/conftest.py: `installed_forja`), walks the test run's sandbox from a project
folder of its own with the inventory/sandbox that the wheel carries (its endpoints moved to the test
sandbox's, tests/testsandbox.py): check, up, configure, train the digits demo, tunnel --print,
status and runs; then down --delete, so the sandbox is left without VMs, as the e2e expects it.

Short on purpose (it counts against the host tier's time): the VM boots over the site-env layer
(its install is the e2e's subject, not this test's), the demo trains for seconds on a CPU, and
the tunnel is printed, not opened. It shares the test sandbox (its VMs, its port), so it runs in
the "sandbox" group of tests/lanes.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import testsandbox
from installed_wheel import Installed

from forja_sandbox import service

#: The walk's run, named so that its results and history entry are its own.
RUN = "installed-walk"

pytestmark = [pytest.mark.hosts, pytest.mark.slow]


def test_the_installed_forja_walks_the_sandbox_from_another_folder(
        sandbox_cloud: dict[str, str], installed_forja: Installed, tmp_path: Path) -> None:
    service.ensure_running()  # an earlier test of the group may have removed it (the e2e's teardown)
    inventory = testsandbox.write_inventory(tmp_path / "inventory" / "sandbox",
                                            source=installed_forja.content / "inventory" / "sandbox")
    project = tmp_path / "project"  # the user's folder: not the clone, not the venv
    project.mkdir()
    # keeps FORJA_SANDBOX_* (tests/conftest.py): the installed `forja sandbox` is the test sandbox's
    env = installed_forja.env(FORJA_HOME=str(tmp_path / "forja-home"))
    forja = [str(installed_forja.bin / "forja"), "-i", str(inventory)]

    def step(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*forja, *args], cwd=project, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert proc.returncode == 0, f"forja {' '.join(args)}: " + proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    def instances() -> list[dict]:
        argv = [str(installed_forja.bin / "forja"), "sandbox", "status", "--json"]
        proc = subprocess.run(argv, cwd=project, env=env, capture_output=True, text=True, timeout=120,
                              check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)["instances"]

    assert instances() == [], "the test sandbox has VMs before the walk: an earlier test left them"
    try:
        # The sandbox's project is ready for a VM: forja check finds nothing to fix (exit 0).
        step("check", timeout=300)
        with testsandbox.vms_over_the_site_env():  # the VM's install is the e2e's subject, not this one's
            made = step("--json", "up")
        assert json.loads(made.stdout)["status"] == "successful"
        step("configure", timeout=1200)
        config = installed_forja.site_packages / "trainer" / "configs" / "digits.yaml"  # the wheel's trainer
        trained = json.loads(step("--json", "train", str(config), "--name", RUN, timeout=1200).stdout)
        assert (trained["run_id"], trained["status"]) == (RUN, "completed"), trained
        assert Path(trained["artifact_dir"]).is_relative_to(project), trained["artifact_dir"]
        tunnel = step("tunnel", "--print", timeout=300)
        printed = tunnel.stdout + tunnel.stderr  # the plan is said on stderr, as progress is
        assert "tunnel: ssh" in printed and "http://localhost:8888/?token=" in printed, printed
        status = json.loads(step("--json", "status", timeout=300).stdout)
        assert (RUN, "completed") in {(s["run"], s["status"]) for s in status}, status
        runs = json.loads(step("--json", "runs", timeout=120).stdout)
        assert (RUN, "completed") in {(r["run_id"], r["status"]) for r in runs}, runs
    finally:
        down = subprocess.run([*forja, "down", "--delete"], cwd=project, env=env, capture_output=True,
                              text=True, timeout=900, check=False)
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert instances() == [], "down --delete left a VM in the test sandbox"
