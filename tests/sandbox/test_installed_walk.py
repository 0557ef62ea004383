"""The installed forja drives a cloud from any folder: the wheel, installed into a venv outside the
clone (tests/sandbox/conftest.py: `installed_forja`), walks the test run's sandbox from a project
folder of its own with the inventory/sandbox that the wheel carries (its endpoints moved to the test
sandbox's, tests/testsandbox.py). The commands are the README's quick start, read from its block
marked `<!-- walk: sandbox -->` (tests/docblocks.py), so a quick start that no longer works fails
here: check, up, configure, train the digits demo, tunnel --print, status and runs; then down
--delete, so the sandbox is left without VMs, as the e2e expects it. The walk adds only what a test
needs to each command (`-i` the test inventory, `--json` where it reads the answer, the run's
`--name`, the wheel's copy of the config) and checks each answer.

Short on purpose (it counts against the host tier's time): the VM boots over the site-env layer
(its install is the e2e's subject, not this test's), the demo trains for seconds on a CPU, and
the tunnel is printed, not opened. It shares the test sandbox (its VMs, its port), so it runs in
the "sandbox" group of tests/lanes.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import docblocks
import pytest
import testsandbox
from installed_wheel import Installed

from forja_sandbox import service

#: The walk's run, named so that its results and history entry are its own.
RUN = "installed-walk"
#: The verbs of the README's quick start, in its order; a verb the walk does not know fails, naming it.
WALK_VERBS = ["check", "up", "configure", "train", "tunnel", "status", "runs", "down"]
#: Verbs whose answer the walk reads: run with `forja --json`.
READ_AS_JSON = frozenset({"up", "train", "status", "runs"})
#: Seconds each verb may take on the test sandbox.
TIMEOUTS = {"check": 300, "configure": 1200, "train": 1200, "tunnel": 300, "status": 300, "runs": 120}


def as_walked(argv: list[str], configs: Path) -> list[str]:
    """One README command as the walk runs it: `--json` where the walk reads the answer, the run named
    RUN, and the README's `trainer/configs/...` read from the wheel's trainer (the walk is not in a
    clone)."""
    if argv[0] == "train":
        argv = [str(configs / Path(a).name) if a.startswith("trainer/configs/") else a for a in argv]
        argv += ["--name", RUN]
    return ["--json", *argv] if argv[0] in READ_AS_JSON else argv

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

    readme = docblocks.walk("sandbox")  # the README's quick start, as people read it
    assert [argv[0] for argv in readme] == WALK_VERBS, (
        f"the README's quick start is now {readme}: teach this walk its new steps and what to check")
    *steps, down_argv = readme
    assert down_argv == ["down", "--delete"], down_argv  # it must leave the sandbox without VMs
    configs = installed_forja.site_packages / "trainer" / "configs"  # the wheel's trainer

    def check_answer(verb: str, proc: subprocess.CompletedProcess[str]) -> None:
        """What each step of the walk must have done."""
        if verb == "up":
            assert json.loads(proc.stdout)["status"] == "successful"
        elif verb == "train":
            trained = json.loads(proc.stdout)
            assert (trained["run_id"], trained["status"]) == (RUN, "completed"), trained
            assert Path(trained["artifact_dir"]).is_relative_to(project), trained["artifact_dir"]
        elif verb == "tunnel":
            printed = proc.stdout + proc.stderr  # the plan is said on stderr, as progress is
            assert "tunnel: ssh" in printed and "http://localhost:8888/?token=" in printed, printed
        elif verb == "status":
            status = json.loads(proc.stdout)
            assert (RUN, "completed") in {(s["run"], s["status"]) for s in status}, status
        elif verb == "runs":
            runs = json.loads(proc.stdout)
            assert (RUN, "completed") in {(r["run_id"], r["status"]) for r in runs}, runs

    assert instances() == [], "the test sandbox has VMs before the walk: an earlier test left them"
    try:
        for argv in steps:
            verb = argv[0]
            if verb == "tunnel":  # an open tunnel would hold the walk until its timeout
                assert "--print" in argv, f"the README's quick start opens a tunnel: {argv}"
            if verb == "up":  # the VM's install is the e2e's subject, not this one's
                with testsandbox.vms_over_the_site_env():
                    proc = step(*as_walked(argv, configs))
            else:  # check: the sandbox's project is ready for a VM, nothing to fix (exit 0)
                proc = step(*as_walked(argv, configs), timeout=TIMEOUTS[verb])
            check_answer(verb, proc)
    finally:
        down = subprocess.run([*forja, *down_argv], cwd=project, env=env, capture_output=True,
                              text=True, timeout=900, check=False)
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert instances() == [], "down --delete left a VM in the test sandbox"
