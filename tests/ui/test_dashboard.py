"""`forja ui` in a real headless browser: the page loads, and a running run's step rises on screen.

Real parts only: the built-in trainer trains on the CPU in its own process and serves its live
metrics (trainer/live.py, as on a host behind the tunnel); a finished run has its fetched plots; the
history is a real file; the VM's record comes from a real inventory file; `forja ui` is the installed
command; the browser is Debian's chromium (`apt-get install chromium`) driven by playwright. The
screenshots stay in results/ui/ (their paths are printed) for a person to look at.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from forja.history import History, summary_fields
from forja.live import LiveError, scrape
from trainer import run_folder

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Where the screenshots stay for a person to look at (results/ is the repository's ignored output folder).
SHOTS = REPO / "results" / "ui"
URL_LINE = re.compile(r"forja ui: (http://127\.0\.0\.1:(\d+)/)\?token=(\S+)")
VM = {"machine_type": "g2-standard-8", "zone": "us-east1-d", "provisioning_model": "SPOT",
      "status": "RUNNING", "last_start_timestamp": "2026-11-24T22:00:00Z",
      "creation_timestamp": "2026-11-20T08:00:00Z", "boot_disk_size_gb": 300}  # fmt: skip

# Never skipped in CI (CI=true): there `make setup` installed chromium, and a skip would hide a broken setup.
pytestmark = [pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (apt-get install chromium; make setup does)",
), pytest.mark.slow]  # a real dashboard and a browser: over 20 s (bench/suite_times.py), not make check


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def config(path: Path, out: Path, steps: int, plots: bool) -> Path:
    path.write_text(yaml.safe_dump({
        "model": "trainer.demo:digits_cnn", "data": "trainer.demo:digits", "steps": steps, "batch_size": 32,
        "lr": 0.002, "log_every_steps": 10, "eval_every_steps": 0, "device": "cpu", "render_plots": plots,
        "price_per_hour": 0.56, "out_dir": str(out), "checkpoint_every_s": 3600,
    }))  # fmt: skip
    return path


def trainer(cfg: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "trainer", "train", "--config", str(cfg)]
    return subprocess.Popen(command, env=env, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A finished run with its plots, a run training now and serving metrics, and `forja ui` over both."""
    root = tmp_path_factory.mktemp("ui")
    env = {**os.environ, "FORJA_HOME": str(root / "home")}
    env.pop("FORJA_INVENTORY", None)
    history = History(root / "home" / "history.sqlite")

    inventory = root / "inventory.yml"  # the VM's record, as the inventory plugin gives it
    inventory.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": {"forja-l4": VM}}}}}))
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    history.start("digits-live", name="digits-live", hosts=["forja-l4"])
    live_env = {**env, "FORJA_METRICS_PORT": str(port), "FORJA_METRICS_PORTS": "1",
                "FORJA_RUN": "digits-live"}  # what trainer_run's run.env sets on a host
    running = trainer(config(root / "live.yaml", root / "live", 200_000, plots=False), live_env,
                      root / "live.log")  # fmt: skip
    ui: subprocess.Popen[bytes] | None = None
    try:
        done = root / "results" / "digits-done" / "forja-l4"  # trains meanwhile: the two set up together
        started = history.start("digits-done", name="digits-done", hosts=["forja-l4"]).started_at
        finished = trainer(config(root / "done.yaml", done, 60, plots=True), env, root / "done.log")
        assert finished.wait(120) == 0, (root / "done.log").read_text()[-2000:]
        history.record_event("digits-done", "preempted", zone="us-east1-d", seconds_down=30.0)
        history.record_event("digits-done", "zone_moved", from_zone="us-east1-d", to_zone="us-east1-b",
                             seconds_down=60.0)  # fmt: skip
        ended = datetime.fromisoformat(started) + timedelta(seconds=300)  # the watcher's outages fit in it
        summary = summary_fields(json.loads((done / run_folder.SUMMARY).read_text()))
        history.update("digits-done", status="completed", artifact_dir=str(done), ended_at=ended.isoformat(),
                       **summary)  # fmt: skip

        deadline = time.monotonic() + 90
        while True:
            try:
                if (scrape(url, timeout=1).step or 0) > 0:
                    break
            except LiveError:
                pass
            log = (root / "live.log").read_text()[-2000:]
            assert running.poll() is None and time.monotonic() < deadline, log
            time.sleep(0.3)

        ui_out = root / "ui.log"
        command = [str(Path(sys.executable).with_name("forja")), "-i", str(inventory), "ui", "--port", "0",
                   "--metrics-url", url]  # fmt: skip
        ui = subprocess.Popen(command, env=env, cwd=REPO, stdout=ui_out.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not (found := URL_LINE.search(ui_out.read_text())):
            assert ui.poll() is None and time.monotonic() < deadline, ui_out.read_text()
            time.sleep(0.2)
        base, token = found.group(1), found.group(3)
        while True:  # the URL is printed just before uvicorn answers
            try:
                requests.get(base, timeout=2)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        yield {"root": root, "base": base, "token": token, "log": ui_out, "ui": ui}
    finally:
        if ui is not None:
            stop(ui)
        stop(running)


@contextlib.contextmanager
def another_local_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A second HTTP server on 127.0.0.1 (another port) that records each request's headers."""
    seen: list[dict[str, str]] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, **dict(self.headers.items())})
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html><body>another local server</body></html>")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/", seen
    finally:
        server.shutdown()
        server.server_close()


def test_it_listens_on_the_loopback_only(dashboard: dict[str, Any]) -> None:
    port = int(dashboard["base"].rsplit(":", 1)[1].strip("/"))
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    local = [line.split()[3] for line in listening.splitlines()]  # State Recv-Q Send-Q Local Peer
    assert local == [f"127.0.0.1:{port}"]


def test_the_page_shows_the_runs_and_a_running_runs_step_rises_on_screen(dashboard: dict[str, Any]) -> None:
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    shot, finished = SHOTS / "dashboard.png", SHOTS / "finished-run.png"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1300})
        asked: list[str] = []
        page.on("request", lambda request: asked.append(request.url))
        page.goto(f"{dashboard['base']}?token={dashboard['token']}")
        assert "token" not in page.url, "the token leaves the address bar"
        kept = page.evaluate("() => sessionStorage.getItem('forja-ui-token')")
        assert kept == dashboard["token"], "the tab keeps the token (this origin, this port only)"
        shows_steps = "() => /^[0-9,]+ \\/ 200,000$/.test(document.getElementById('live-step').textContent)"
        page.wait_for_function(shows_steps, timeout=20_000)
        first = int(page.text_content("#live-step").split("/")[0].replace(",", ""))
        page.wait_for_function(
            f"() => parseInt(document.getElementById('live-step').textContent.replace(/,/g, '')) > {first}",
            timeout=20_000,
        )
        later = int(page.text_content("#live-step").split("/")[0].replace(",", ""))
        assert later > first
        rows = page.locator("#runs tbody tr")
        assert rows.count() == 2
        cell = "document.querySelector(\"#runs tr[data-run='digits-live']\").children"
        page.wait_for_function(f"() => {cell}[3].textContent.endsWith('/ 200,000') && {cell}[4].textContent",
                               timeout=15_000)  # the row shows the live step and loss (refreshed every 5 s)
        text = page.text_content("#runs")
        assert "digits-live" in text and "digits-done" in text and "completed" in text
        page.wait_for_function("() => document.querySelectorAll('#chart-loss canvas').length > 0",
                               timeout=10_000)  # fmt: skip
        # the VM panel reads the inventory (ansible-inventory) once, apart from the runs: wait for it
        page.wait_for_function("() => document.querySelectorAll('#vms .card').length > 0", timeout=60_000)
        assert "g2-standard-8 spot" in page.text_content("#vms") and "$0.56/h" in page.text_content("#vms")
        page.screenshot(path=str(shot), full_page=True)

        page.click("#runs tbody tr[data-run='digits-done']")
        page.wait_for_function("() => document.querySelectorAll('#plots img').length >= 4", timeout=10_000)
        loaded = "() => [...document.querySelectorAll('#plots img')].every(i => i.naturalWidth > 0)"
        page.wait_for_function(loaded, timeout=10_000)
        cost = page.text_content("#cost")
        assert "evaluation" in cost and "total" in cost and "1 preempted, 1 zone moves" in cost
        assert "zone moved" in page.text_content("#events") or "zone_moved" in page.text_content("#events")
        page.screenshot(path=str(finished), full_page=True)
        assert page.context.cookies() == [], "no cookie: a browser sends cookies to every port of 127.0.0.1"
        with another_local_server() as (other, seen):
            page.goto(other)  # Jupyter through the tunnel, or anything else on 127.0.0.1
            page.wait_for_load_state()
        browser.close()
    assert seen, "the second server was visited"
    for headers in seen:
        assert "cookie" not in {k.lower() for k in headers}, headers
        assert dashboard["token"] not in json.dumps(headers), "the second server got the token"
    ours = (dashboard["base"], f"blob:{dashboard['base']}")  # the plots are shown from memory (blob:)
    elsewhere = [url for url in asked if not url.startswith(ours) and url != other]
    assert asked and not elsewhere, "the page works with no internet: everything comes from forja ui"
    print(f"screenshots: {shot} and {finished}")
    assert shot.stat().st_size > 10_000


def test_the_token_is_printed_once_and_never_logged(dashboard: dict[str, Any]) -> None:
    log = dashboard["log"].read_text()
    assert log.count(dashboard["token"]) == 1, log
