"""One `Forja` serving two calls at once, on a real test host (th31): real playbooks, real SSH.

Each call streamed by `Forja.iter_events` runs in its own thread with its own cancel token and
its own listener, so two calls never see each other's events and cancelling one leaves the other
running. (Before, one `_cancel` event and one swapped `on_event` were shared by every call.)
The host needs no PyTorch: `status` reads it with playbooks/train_status.yml.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apihosts import write_inventory

from forja import errors
from forja import events as ev
from forja.api import Forja
from forja.history import History
from forja.runner import Stream
from forja_sandbox import testhosts

pytestmark = [pytest.mark.hosts, pytest.mark.slow]
INDEX = 31


@pytest.fixture(scope="module")
def th31() -> Iterator[testhosts.Host]:
    if os.geteuid() != 0:
        pytest.skip("test hosts need root")
    host = testhosts.up(INDEX)
    try:
        yield host
    finally:
        testhosts.down(INDEX)


@pytest.fixture
def forja(th31: testhosts.Host, tmp_path: Path) -> Forja:
    inventory = write_inventory(tmp_path / "inventory.yml", {"th31": {
        "ansible_host": th31.address, "ansible_user": th31.user,
        "ansible_ssh_private_key_file": str(th31.key)}})
    return Forja(project_dir=tmp_path, inventory=inventory, private_data_dir=tmp_path / "runner",
                 host_key_checking=False, history=History(tmp_path / "history.sqlite"))


def consume(stream: Stream[ev.Event, Any], seen: list[tuple[float, Any]]) -> threading.Thread:
    """Iterate a stream in its own thread, noting when each item arrived (exceptions are items)."""

    def loop() -> None:
        try:
            for item in stream:
                seen.append((time.monotonic(), item))
        except BaseException as exc:  # the test looks at it
            seen.append((time.monotonic(), exc))

    thread = threading.Thread(target=loop)
    thread.start()
    return thread


def test_two_calls_at_once_each_stream_only_their_own_playbook(forja: Forja) -> None:
    seen: dict[str, list[tuple[float, Any]]] = {"a": [], "b": []}
    threads = [consume(forja.iter_events("status"), seen["a"]),
               consume(forja.iter_events("status"), seen["b"])]
    for thread in threads:
        thread.join(timeout=300)
    for name, items in seen.items():
        kinds = [type(item) for _, item in items]
        assert kinds.count(ev.PlaybookStarted) == 1, f"call {name} saw another call's playbook: {kinds}"
        assert kinds.count(ev.PlaybookFinished) == 1, f"call {name}: {kinds}"
        assert items[-1][1] == [], f"call {name} returns the host's runs (none on a fresh host)"
    a_start, a_end = seen["a"][0][0], seen["a"][-1][0]
    b_start, b_end = seen["b"][0][0], seen["b"][-1][0]
    assert a_start < b_end and b_start < a_end, "the two calls ran at the same time"


def test_cancelling_one_call_leaves_the_other_running(forja: Forja) -> None:
    seen: dict[str, list[tuple[float, Any]]] = {"cancelled": [], "kept": []}
    doomed = forja.iter_events("status")
    kept = forja.iter_events("status")
    doomed.cancel()
    threads = [consume(doomed, seen["cancelled"]), consume(kept, seen["kept"])]
    for thread in threads:
        thread.join(timeout=300)
    assert isinstance(seen["cancelled"][-1][1], errors.Cancelled)
    assert seen["kept"][-1][1] == [], "the other call ran to its end"
    assert any(isinstance(item, ev.PlaybookFinished) for _, item in seen["kept"])


def test_a_cancel_with_nothing_running_does_not_cancel_the_next_call(forja: Forja) -> None:
    forja.cancel()
    assert forja.status() == []
