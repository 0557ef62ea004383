"""The host tier's lanes: which xdist worker runs which test (tests/conftest.py's scheduler).

A plain module, not the conftest, so that tests can import it: under pytest's import mode every
conftest.py is a module named `conftest`, and `import conftest` gets whichever came last.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# What a test file shares with others beyond its own hosts and ports runs on one worker, in one
# group: the API tests share the session's th6 (tests/api/conftest.py); the end-to-end tests and
# the cluster's share the default sandbox (its port, its VMs), and a private sandbox's VM takes the
# same first test host (th10) and `forja tunnel` the same local port 8888. Every other file is its
# own group: module fixtures are never split across workers.
SHARED_GROUPS = {
    "tests/api/": "api",
    "tests/sandbox/test_site_e2e.py": "sandbox",
    "tests/sandbox/test_cluster_training.py": "sandbox",
    "tests/cli/test_cli_sandbox.py": "sandbox",
    "tests/sandbox/test_installed_walk.py": "sandbox",
}


#: Host files that share nothing with the test sandbox (each has a test host of its own) but run in
#: its lane when there are two, to even the lanes: in the two-lane CI run of 7e6808c the other host
#: lane held the longer host work (its worker 2,308 s, the sandbox's 2,045 s, idle at the end), and
#: the slow tests that boot nothing can only fill in after a lane's host tests. The own machine's
#: (th44, 150 s) joined when the e2e's Ctrl-C waits were gone (6df4d59): the sandbox's lane
#: then held about 1,420 s of the 1,870 s it took at 6f42c96, the other lane 1,879 s.
SANDBOX_LANE_TOO = frozenset({"tests/rerun/test_drift.py", "tests/own_machine/test_own_machine.py"})


def xdist_group_of(nodeid: str) -> str:
    """The group a test runs in: its file's, or the shared group its file belongs to; each molecule
    scenario alone (each has its own hosts)."""
    path = nodeid.split("::", 1)[0]
    if path == "tests/molecule/test_scenarios.py":
        return nodeid
    return next((g for prefix, g in SHARED_GROUPS.items() if path.startswith(prefix)), path)


#: Where the workers tell the controller which files hold host tests (the host tier's two lanes).
HOST_FILES_ENV = "FORJA_HOST_FILES"


def lane_of(nodeid: str, host_files: frozenset[str], host_lanes: int = 1) -> str:
    """The host tier's lanes: every file with host tests is in a host lane, run one test at a time on
    one worker (their converges and trainings need the cores); each other file is its own group, for
    the other worker (torch and emulator tests that boot nothing). `host_lanes=2` (HOST_LANES) splits
    the host tests in two lanes that share nothing: the test sandbox's ("sandbox": its VMs, its port,
    local port 8888; then `SANDBOX_LANE_TOO`) and the rest ("hosts": test hosts of fixed indices, each
    suite its own). Without host tests in the run, the groups of `xdist_group_of`."""
    path = nodeid.split("::", 1)[0]
    group = xdist_group_of(nodeid)
    if path not in host_files:
        return group
    return "sandbox" if host_lanes == 2 and (group == "sandbox" or path in SANDBOX_LANE_TOO) else "hosts"


def host_lanes() -> int:
    """HOST_LANES: 2 (the sandbox's apart, the default, as in the Makefile) or 1 (every host test on
    one worker); refused otherwise."""
    lanes = os.environ.get("HOST_LANES", "2")
    if lanes not in ("1", "2"):
        raise pytest.UsageError(f"HOST_LANES={lanes!r}: use 1 (one host lane) or 2 (the sandbox's apart)")
    return int(lanes)


def host_files() -> frozenset[str]:
    """The files with host tests, as the workers wrote them after collecting (empty when none did)."""
    path = os.environ.get(HOST_FILES_ENV)
    if not path or not Path(path).exists():
        return frozenset()
    return frozenset(Path(path).read_text().split())
