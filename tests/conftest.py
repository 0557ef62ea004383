"""Shared pytest setup: real test hosts need root and the Debian tools the README's setup installs."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import signal
import tempfile
import time
from typing import Any

import pytest

with contextlib.suppress(ImportError):  # without the trainer extra, its tests are not collected either
    # ansible-core replaces sys.intern with a wrapper object when its module_utils are imported
    # (the gcp tests load them in this process); torch._dynamo, imported lazily by the first
    # optimizer step, then refuses to register its polyfill for that object and every later
    # trainer test fails. Loading dynamo first, while sys.intern is still the builtin, keeps one
    # pytest process able to hold both, as the product never has to (they live in different
    # processes there).
    import torch._dynamo  # noqa: F401

from pathlib import Path

import lanes
import testsandbox
from ansible.plugins.loader import init_plugin_loader

from forja_sandbox import service, testhosts

# Every test run has its own sandbox cloud (folder, port, host slots), never the one `make sandbox`
# made: tests/testsandbox.py. Set before any test, so every subprocess inherits it.
os.environ.update(testsandbox.env())
# Nor the user's run history (~/.local/share/forja): each pytest process has a folder of its own,
# which its subprocesses (forja, ansible-playbook's history record) inherit. Tests that need a
# history of their own still set FORJA_HOME themselves.
os.environ["FORJA_HOME"] = tempfile.mkdtemp(prefix="forja-test-home-")
atexit.register(shutil.rmtree, os.environ["FORJA_HOME"], ignore_errors=True)
# Nor a `forja plan` (seconds of CPU) before each `forja train` of a config never run: the estimate's
# use of the plan is proven once, in tests/cost/test_run_cost.py, which turns it back on.
os.environ["FORJA_ESTIMATE_PLAN"] = "0"

#: Where the run's time goes, per test phase and per fixture set-up (tests/timings.py).
pytest_plugins = ["timings"]

# `make test` runs the tests on two xdist workers (a serial run keeps one of this machine's two
# cores idle: test hosts and Ansible wait on each other). Each worker keeps its own Ansible fact
# cache: the jsonfile cache writes in place, and two plays gathering one host name at once would
# read each other's half-written files.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("ANSIBLE_CACHE_PLUGIN_CONNECTION", str(
        Path.home() / ".cache" / "forja" / f"facts-{os.environ['PYTEST_XDIST_WORKER']}"))

# forja's plugins are the collection forja.gpu: tests import and load them as Ansible does
# (ansible_collections.forja.gpu..., filter_loader.get("forja.gpu.forja_hourly_rate")), from the
# clone's link collections/ansible_collections/forja/gpu, the path ansible.cfg names first.
init_plugin_loader([str(Path(__file__).resolve().parents[1] / "collections")])


def _is_host_tier_controller(config: pytest.Config) -> bool:
    """The xdist controller of a run that may hold host tests: any but `make check` (FORJA_TIER=check,
    which boots no host: `testhosts.refuse_in_check_tier`)."""
    return bool(getattr(config.option, "numprocesses", None) and not os.environ.get("PYTEST_XDIST_WORKER")
                and os.environ.get("FORJA_TIER") != "check")


def pytest_configure(config: pytest.Config) -> None:
    """The xdist controller of a run that may hold host tests names a file for the workers' list of
    host files (`lane_of`); the workers, started after this, inherit its path.

    A run started in the background by a shell without job control (`make test &`, nohup) inherits
    SIGINT ignored, and so would every command a test starts: Python keeps an ignored SIGINT, so
    `forja tunnel` then sat through a test's Ctrl-C until its 60 s kill (the e2e took 450 s longer).
    A handler here is reset to the default at each exec, so the workers and the commands they start
    get Ctrl-C as a user's terminal gives it."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _is_host_tier_controller(config):
        lanes.host_lanes()  # a bad HOST_LANES is said before any worker starts
        handle, path = tempfile.mkstemp(prefix="forja-host-files-")
        os.close(handle)
        os.unlink(path)
        os.environ[lanes.HOST_FILES_ENV] = path
        atexit.register(lambda: Path(path).unlink(missing_ok=True))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with the groups above: xdist's own scheduler of whole scopes, each scope a
    group. (xdist's `loadgroup` marks do not group under pytest 9.2, whose node ids are no longer the
    `_nodeid` that xdist 3.8 rewrites.) xdist schedules once every worker has collected, so the list
    of host files is there; a worker whose pending group has more than one test left gets no other,
    so the host lane's worker runs nothing else until its last host test."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        host_files: frozenset[str] | None = None
        host_lanes = lanes.host_lanes()

        def _split_scope(self, nodeid: str) -> str:
            if self.host_files is None:  # read once: every worker has collected by the first call
                self.host_files = lanes.host_files()
            return lanes.lane_of(nodeid, self.host_files, self.host_lanes)

    return GroupScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Name each failure when it happens, with its time, not only in the summary at the end: a CI
    run stopped by its time limit never prints that summary, and its log must still say what broke."""
    if report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        print(f"\nFAILED {report.nodeid} ({report.when}, {report.duration:.0f} s)", flush=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the groups for the workers (longest first), then skip host tests where they cannot run.

    xdist hands whole groups to workers in the order the workers collected them: the host tests go
    first (the host lane, `lane_of`), so that the long ones do not start last and leave one worker
    idle at the end; in one host lane the sandbox's come last of them, in two first.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        group = {i.nodeid: lanes.xdist_group_of(i.nodeid) for i in items}
        hosts = {group[i.nodeid] for i in items if "hosts" in i.keywords}
        rank = {g: n for n, g in enumerate(dict.fromkeys(group.values()))}
        # One host lane: the sandbox's tests last, once the CPU lane is done (the e2e's ssh and sudo
        # waits timed out when it ran beside other work). Two: first, so each lane starts at once.
        sandbox_first = lanes.host_lanes() == 2
        items.sort(key=lambda i: (group[i.nodeid] not in hosts,
                                  (group[i.nodeid] == "sandbox") != sandbox_first, rank[group[i.nodeid]]))
        _tell_the_controller_the_host_files(items)
    _skip_hosts_where_they_cannot_run(config, items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run without xdist holds the test hosts when a host test is left after `-m` and `-k`."""
    if (not os.environ.get("PYTEST_XDIST_WORKER") and os.geteuid() == 0
            and any("hosts" in i.keywords for i in session.items)):
        _hold_the_test_hosts(session.config)


def _tell_the_controller_the_host_files(items: list[pytest.Item]) -> None:
    """Write the files with host tests where the controller's scheduler reads them (`lane_of`); each
    worker writes the same list, whole (a rename), so a reader never sees half of one."""
    path = os.environ.get(lanes.HOST_FILES_ENV)
    if not path:
        return
    files = sorted({i.nodeid.split("::", 1)[0] for i in items if "hosts" in i.keywords})
    part = Path(f"{path}.{os.environ['PYTEST_XDIST_WORKER']}")
    part.write_text("\n".join(files) + "\n")
    part.replace(path)


#: The open lock file of this run's hold on the test hosts (kept open for the whole session).
_HOSTS_LOCK: list[Any] = []


def _hold_the_test_hosts(config: pytest.Config) -> None:
    """Refuse, naming the other run, when another test run on this machine holds the test hosts.

    Two suites at once would boot the same thN, bridge and sandbox port and fail each other in ways
    that look like bugs. The lock is the kernel's (flock): a killed run leaves no stale lock behind.
    """
    if _HOSTS_LOCK:
        return
    path = testhosts.base_dir() / ".test-run.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise pytest.UsageError(
            f"another test run holds the test hosts ({holder}); wait for it to end, or stop it "
            f"(the lock is {path}). Tests without hosts run alone with `make check`.") from None
    handle.seek(0)
    handle.truncate()
    args = " ".join(config.invocation_params.args)[:200]
    handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: pytest {args}\n")
    handle.flush()
    _HOSTS_LOCK.append(handle)
    if config.option.collectonly:
        return  # nothing runs: nothing to clean or write
    testsandbox.remove_leftovers()  # no other run is live: whatever is up was left by one
    testsandbox.write_inventory()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under xdist the controller collects nothing: it takes the hosts' lock for its workers, unless
    the run is `make check` (FORJA_TIER=check, which boots no host: `testhosts.refuse_in_check_tier`)."""
    if _is_host_tier_controller(session.config):
        _hold_the_test_hosts(session.config)


@pytest.fixture(scope="session")
def sandbox_cloud() -> Any:
    """The test run's own sandbox cloud (tests/testsandbox.py), started once for every test that needs
    it, as `make sandbox` starts it (no inventory starts it); a test adds faults for its drills
    through the emulator's fault API (`service.inject_fault`) instead of restarting it. Removed at
    the end of the run; what an interrupted run left is removed when the next starts."""
    endpoint = service.ensure_running()
    yield endpoint
    service.destroy()


def _skip_hosts_where_they_cannot_run(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip host tests only where they cannot run at all (not root, tools missing), saying why.

    In CI (root, tools installed by `make setup`) nothing is skipped; set FORJA_REQUIRE_HOSTS=1
    to turn a would-be skip into a failure.
    """
    missing = [t for t in ("systemd-nspawn", "debootstrap", "nft", "ip") if shutil.which(t) is None]
    reason = ""
    if os.geteuid() != 0:
        reason = "test hosts need root"
    elif missing:
        reason = f"test hosts need {', '.join(missing)} (run `make setup`)"
    if not reason:
        return
    if os.environ.get("FORJA_REQUIRE_HOSTS") == "1" or os.environ.get("CI") == "true":
        raise pytest.UsageError(f"real test hosts are required here but unavailable: {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "hosts" in item.keywords:
            item.add_marker(skip)
