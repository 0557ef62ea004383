"""A pytest plugin that records where a run's time goes, for `bench/suite_times.py` and CI's margin.

pytest's `--durations` lumps every fixture a test sets up into its "setup" phase and names no
fixture, so the bring-ups (the sandbox, test hosts, converges) hide inside whichever test happened
to come first. This plugin writes one JSON line per test phase and one per fixture set-up taking
over a tenth of a second, with its scope, to the file named by ``FORJA_TEST_TIMES`` (default
``.ci-logs/test-times.jsonl``; appended to, so the two tiers of `make test` land in one file).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

#: Fixture set-ups shorter than this are not recorded: the file stays small and the bring-ups stand out.
MIN_FIXTURE_S = 0.1


#: The file this process appends to: resolved once, when pytest starts, so a test that changes the
#: working folder does not send the later records elsewhere.
_OUT: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    path = Path(os.environ.get("FORJA_TEST_TIMES") or ".ci-logs/test-times.jsonl").absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    _OUT[:] = [path]


def _write(record: dict[str, Any]) -> None:
    record["worker"] = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with _OUT[0].open("a") as f:  # one short line per write: workers' lines do not interleave
        f.write(json.dumps(record) + "\n")


#: The test being set up: a session or module fixture's own node names no test, and the tables
#: say which test's set-up paid for a bring-up.
_CURRENT: list[str] = [""]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _CURRENT[0] = item.nodeid


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Generator[None]:
    start = time.monotonic()
    yield
    took = time.monotonic() - start
    if took >= MIN_FIXTURE_S:
        _write({"kind": "fixture", "fixture": fixturedef.argname, "scope": fixturedef.scope,
                "nodeid": _CURRENT[0] or request.node.nodeid, "duration": round(took, 3)})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _write({"kind": "phase", "nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "duration": round(report.duration, 3), "stop": round(report.stop, 3)})


def pytest_sessionstart(session: pytest.Session) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _write({"kind": "session", "event": "start", "time": round(time.time(), 3),
                "args": [str(a) for a in session.config.invocation_params.args]})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _write({"kind": "session", "event": "finish", "time": round(time.time(), 3),
                "exitstatus": int(exitstatus)})
