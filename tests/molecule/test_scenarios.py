"""Each molecule scenario (molecule/*/) as a test: `molecule test -s NAME`, its whole sequence.

`make test` and `make molecule` run them here, so that they share the two workers with the other
tests instead of running one after another at the end; each scenario is its own group
(tests/conftest.py) on its own test hosts (molecule.yml's `index`). The whole output is kept in
.ci-logs/; a failure shows the failing tasks and assertion lines, so the end of a CI log says what
broke. One scenario alone: `pytest tests/molecule -k NAME`, or `molecule test -s NAME`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted(p.parent.name for p in (ROOT / "molecule").glob("*/molecule.yml"))
#: The lines of a molecule log that say what broke: a failed task, a verifier's assertion, a count.
FAILURE_LINE = re.compile(r"fatal: \[|^ *E  |\.py::|[0-9]+ (passed|failed)")
ESCAPES = re.compile(r"\x1b\[[0-9;]*m")
#: The seconds since the scenario started, at the head of each log line: where its time went.
STAMP = re.compile(r"^\[ *[0-9]+ s\] ")


def failure_summary(log: str, lines: int = 30) -> str:
    """The last `lines` lines of a molecule log that name a failure, colours and box edges removed."""
    plain = (re.sub(r"^ *[│┌└]", "", STAMP.sub("", ESCAPES.sub("", line))) for line in log.splitlines())
    return "\n".join([line[:300] for line in plain if FAILURE_LINE.search(line)][-lines:])


@pytest.mark.timeout(2400)  # a whole sequence: create, converge, idempotence, verify, destroy
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: str) -> None:
    logs = ROOT / ".ci-logs"
    logs.mkdir(exist_ok=True)
    log = logs / f"molecule-{scenario}.log"
    started = time.monotonic()
    with log.open("w") as out, subprocess.Popen(
            [str(Path(sys.executable).with_name("molecule")), "test", "-s", scenario], cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, errors="replace") as done:
        assert done.stdout is not None
        for line in done.stdout:
            out.write(f"[{time.monotonic() - started:4.0f} s] {line}")
    assert done.returncode == 0, (
        f"molecule test -s {scenario} failed (whole log: {log}):\n"
        + failure_summary(log.read_text(errors="replace")))


def test_the_failure_summary_keeps_the_lines_that_say_what_broke() -> None:
    log = ("[  12 s] \x1b[0;32mok: [th5]\x1b[0m\n"
           "\x1b[0;31mfatal: [th5]: FAILED! => {\"msg\": \"the unit is missing\"}\x1b[0m\n"
           "TASK [Install it] ****\n"
           "  │ E   AssertionError: the agent did not stop the VM\n"
           "  │ tests/test_autostop.py::test_it_stops FAILED\n"
           "[ 812 s] 1 failed, 7 passed in 80.00s\n")
    assert failure_summary(log).splitlines() == [
        'fatal: [th5]: FAILED! => {"msg": "the unit is missing"}',
        " E   AssertionError: the agent did not stop the VM",
        " tests/test_autostop.py::test_it_stops FAILED",
        "1 failed, 7 passed in 80.00s",
    ]
    assert len(failure_summary("fatal: [h]\n" * 50, lines=30).splitlines()) == 30
