"""The sandbox service starts once however many callers race, and stop_service stops that one.

A stale pid file used to let an emulator outlive `destroy()` (and a later drill talk to it,
without its injected faults): the service now writes its pid only once it holds the port.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from forja_sandbox import service

pytestmark = pytest.mark.hosts  # the service needs the golden image before it starts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_racing_callers_start_one_service_and_stop_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORJA_SANDBOX_DIR", str(tmp_path / "sandbox"))
    monkeypatch.setenv("FORJA_SANDBOX_PORT", str(_free_port()))
    endpoints: list[dict[str, str]] = []
    callers = [threading.Thread(target=lambda: endpoints.append(service.ensure_running())) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=120)
    try:
        assert len(endpoints) == 4 and len({e["api_url"] for e in endpoints}) == 1
        pid = int((tmp_path / "sandbox" / "emulator.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert f"serve --port {os.environ['FORJA_SANDBOX_PORT']}" in cmdline, "the pid file names the server"
        assert service.describe()["running"] is True
    finally:
        service.stop_service()
    assert service.answers(service.base_url()) is False, "the emulator that answered was not stopped"
    assert not (tmp_path / "sandbox" / "emulator.pid").exists()
