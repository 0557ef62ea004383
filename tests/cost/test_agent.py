"""The autostop agent's logic, run here on its own (it is a standalone stdlib script).

The real signals (systemd units, TTY sessions over SSH, the poweroff) are tested on a real host
by molecule/autostop; these tests pin the decision rules and the parsers with exact inputs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from forja.cost.spend import Interval, compute_spend

AGENT_PATH = Path(__file__).parents[2] / "roles" / "autostop" / "files" / "forja_autostop.py"
spec = importlib.util.spec_from_file_location("forja_autostop", AGENT_PATH)
agent = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agent)

BOOT = "aaaaaaaa-1111-2222-3333-444444444444"
NOW = 1_800_000_000.0


#: What the role writes from the host contract (roles/host_contract/defaults/main.yml).
CONTRACT = yaml.safe_load((Path(__file__).parents[2] / "roles/host_contract/defaults/main.yml").read_text())
CONTRACT_FIELDS = {
    "jupyter_url": f"http://127.0.0.1:{CONTRACT['host_contract_jupyter_port']}",
    "jupyter_token_file": CONTRACT["host_contract_jupyter_token_file"],
    "train_unit_pattern": CONTRACT["host_contract_train_unit_pattern"],
    "run_dir": CONTRACT["host_contract_run_dir"],
}


def config(**over):
    return {**agent.DEFAULTS, **CONTRACT_FIELDS, "idle_minutes": 1.0, "boot_grace_minutes": 0.0, **over}


def seen(busy=(), notes=("no training unit",), last_activity=None):
    return {"busy": list(busy), "notes": list(notes), "last_activity": last_activity}


def state(**over):
    return {**agent.fresh_state(BOOT, NOW - 30), **over}


# --- Deciding -----------------------------------------------------------------------------------


def test_idle_but_inside_the_window_is_idle():
    record, new = agent.decide(config(), seen(), state(idle_since=NOW - 30), BOOT, 600, NOW)
    assert record["decision"] == "idle"
    assert record["reasons"] == ["idle for 30 s of 60 s: no training unit"]
    assert new["idle_since"] == NOW - 30


def test_idle_for_the_whole_window_stops():
    record, new = agent.decide(config(), seen(), state(idle_since=NOW - 61), BOOT, 600, NOW)
    assert record["decision"] == "stop"
    assert record["reasons"] == ["idle for 61 s (window 60 s): no training unit"]
    assert new["stopping"] is True


def test_dry_run_would_stop_and_does_not_mark_a_stop():
    record, new = agent.decide(config(dry_run=True), seen(), state(idle_since=NOW - 61), BOOT, 600, NOW)
    assert record["decision"] == "would-stop" and record["dry_run"] is True
    assert new["stopping"] is False


def test_anything_busy_keeps_the_vm_and_restarts_the_window():
    busy = ["kernel 3f2c busy", "ssh session pts/0 (user ansible from 10.0.0.2)"]
    record, new = agent.decide(config(), seen(busy=busy), state(idle_since=NOW - 3600), BOOT, 600, NOW)
    assert record == {**record, "decision": "keep", "reasons": busy}
    assert new["idle_since"] == NOW


def test_recent_kernel_activity_moves_the_start_of_the_window():
    record, _ = agent.decide(
        config(), seen(last_activity=NOW - 20), state(idle_since=NOW - 3600), BOOT, 600, NOW
    )
    assert record["decision"] == "idle" and record["idle_for_s"] == 20


def test_a_new_boot_resets_the_clock_and_carries_the_spend():
    old = state(boot_id="old-boot", idle_since=NOW - 3600, boot_usd=2.0, prior_boots_usd=1.0, stopping=True)
    record, new = agent.decide(config(hourly_rate_usd=3.6), seen(), old, BOOT, 120, NOW)
    assert record["decision"] == "idle"
    assert record["reasons"][0] == "new boot aaaaaaaa: idle clock reset"
    assert new["prior_boots_usd"] == 3.0 and new["boots"] == 2 and new["stopping"] is False
    assert record["spend_usd"] == pytest.approx(3.0 + 3.6 * 120 / 3600)


def test_the_boot_grace_period_holds_every_stop():
    cfg = config(boot_grace_minutes=10, max_runtime_hours=0.01)
    record, _ = agent.decide(cfg, seen(), state(idle_since=NOW - 3600), BOOT, 120, NOW)
    assert record["decision"] == "idle"
    assert "boot grace: up 120 s of 600 s, not stopping yet" in record["reasons"]


def test_the_maximum_runtime_stops_even_a_busy_vm():
    busy = ["training unit forja-train@r1.service running"]
    record, _ = agent.decide(config(max_runtime_hours=2), seen(busy=busy), state(), BOOT, 2 * 3600 + 5, NOW)
    assert record["decision"] == "stop"
    assert record["reasons"] == ["maximum runtime 2h 00m reached (up 2h 00m)", *busy]


def test_the_spend_cap_warns_then_stops():
    cfg = config(hourly_rate_usd=1.0, spend_cap_usd=10.0, spend_warn_fraction=0.8)
    busy = ["training unit forja-train@r1.service running"]
    record, new = agent.decide(cfg, seen(busy=busy), state(prior_boots_usd=7.0), BOOT, 3600 * 1.5, NOW)
    assert record["decision"] == "keep"
    assert record["reasons"][0].startswith("budget warning: spent $8.50 of the $10.00 cap (85%)")
    assert "raise autostop_spend_cap_usd" in new["warning"]
    record, _ = agent.decide(cfg, seen(busy=busy), state(prior_boots_usd=7.0), BOOT, 3600 * 3, NOW)
    assert record["decision"] == "stop"
    assert record["reasons"][0] == "spend cap $10.00 reached (spent $10.00 at $1.00/h)"


def test_a_tiny_budget_is_told_in_fractions_of_a_cent():
    """Figures for people (trainer/figures.py, installed beside the agent): not `$0.00` of `$0.01`."""
    cfg = config(hourly_rate_usd=0.0042, spend_cap_usd=0.01, spend_warn_fraction=0.5)
    record, _ = agent.decide(cfg, seen(), state(), BOOT, 3600 * 1.5, NOW)
    assert record["reasons"][0].startswith("budget warning: spent 0.63¢ of the $0.01 cap (63%)"), record


def test_host_spend_matches_the_controllers_computation():
    start = datetime(2026, 11, 20, tzinfo=timezone.utc)
    for uptime in (20.0, 5400.0):
        controller = compute_spend(0.8536, [Interval(start, start + timedelta(seconds=uptime))], start)
        assert agent.boot_spend(0.8536, uptime) == pytest.approx(controller)


# --- Reading the signals ------------------------------------------------------------------------


def test_gpu_utilisation_lines_are_parsed_and_unreadable_ones_skipped():
    assert agent.parse_gpu_utilisation("57\n0\n[N/A]\n") == [57.0, 0.0]


def test_a_busy_gpu_is_seen_through_nvidia_smi(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 57\necho 3\n")
    smi.chmod(0o755)
    assert agent.gpu_utilisation(str(smi)) == ([57.0, 3.0], "ok")
    assert agent.gpu_utilisation(str(tmp_path / "missing")) == (None, "no GPU")


def utmp_record(kind, pid, line, user, host=""):
    return agent.UTMP_RECORD.pack(
        kind, pid, line.encode(), b"ts/0", user.encode(), host.encode(), 0, 0, 0, 0, 0, b"\0" * 16, b"\0" * 20
    )


def test_only_live_terminal_logins_count_as_sessions(tmp_path):
    dead = 2**22 + 12345  # above pid_max: no such process
    utmp = tmp_path / "utmp"
    utmp.write_bytes(
        utmp_record(2, 0, "~", "reboot")  # BOOT_TIME
        + utmp_record(agent.USER_PROCESS, os.getpid(), "pts/3", "ansible", "10.213.0.1")
        + utmp_record(agent.USER_PROCESS, dead, "pts/4", "gone", "10.0.0.9")
        + utmp_record(agent.USER_PROCESS, os.getpid(), "tty1", "root")
    )
    assert agent.UTMP_RECORD.size == 384  # glibc's struct utmp on 64-bit Linux
    assert agent.interactive_sessions(str(utmp)) == [
        "ssh session pts/3 (user ansible from 10.213.0.1)",
        "login session tty1 (user root)",
    ]


def test_the_real_utmp_of_this_machine_parses():
    assert isinstance(agent.interactive_sessions("/run/utmp"), list)
    assert struct.calcsize("<hxxi32s4s32s256shhiii16s20s") == 384


class FakeJupyter(BaseHTTPRequestHandler):
    """A Jupyter /api/kernels endpoint that insists on the token header, as notebook does."""

    token = "s3cret-token"
    seen_paths: ClassVar[list[str]] = []
    kernels: ClassVar[list[dict]] = []

    def do_GET(self):
        FakeJupyter.seen_paths.append(self.path)
        if self.headers.get("Authorization") != f"token {self.token}":
            self.send_response(403)
            self.end_headers()
            return
        body = json.dumps(self.kernels).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def jupyter(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), FakeJupyter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    token_file = tmp_path / "token"
    token_file.write_text(FakeJupyter.token)
    FakeJupyter.seen_paths = []
    yield config(jupyter_url=f"http://127.0.0.1:{server.server_port}", jupyter_token_file=str(token_file))
    server.shutdown()


def test_kernels_are_read_with_the_token_in_a_header_never_in_the_url(jupyter):
    FakeJupyter.kernels = [
        {"id": "3f2c9a", "execution_state": "busy", "last_activity": "2026-11-22T04:07:18.123456Z"}
    ]
    kernels, status = agent.jupyter_kernels(jupyter)
    assert status == "ok" and kernels[0]["execution_state"] == "busy"
    assert FakeJupyter.seen_paths == ["/api/kernels"]


def test_a_refused_token_leaves_the_kernels_unknown_and_keeps_the_vm(jupyter, tmp_path):
    (tmp_path / "token").write_text("wrong")
    kernels, status = agent.jupyter_kernels(jupyter)
    assert kernels is None and status == "Jupyter answered HTTP 403 to /api/kernels"
    assert "wrong" not in status


def test_no_jupyter_means_no_kernels(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    token = tmp_path / "token"
    token.write_text("t")
    cfg = config(jupyter_url=f"http://127.0.0.1:{port}", jupyter_token_file=str(token))
    assert agent.jupyter_kernels(cfg) == ([], "Jupyter not running")
    assert agent.jupyter_kernels(config(jupyter_token_file=str(tmp_path / "none"))) == (
        [],
        "no Jupyter token file (Jupyter not installed)",
    )


def test_only_a_busy_kernel_is_work_and_the_latest_activity_is_reported():
    t = datetime(2026, 11, 22, 4, 0, tzinfo=timezone.utc).timestamp()
    kernels = [
        {"id": "3f2c9a", "execution_state": "busy", "last_activity": "2026-11-22T03:59:00Z"},
        {"id": "77aa01", "execution_state": "starting", "last_activity": "2026-11-22T03:59:30Z"},
        {"id": "9b9b9b", "execution_state": "idle"},
    ]
    busy, notes, last = agent.kernel_signals(kernels, t)
    assert busy == ["kernel 3f2c busy"]
    assert notes == ["kernel 77aa starting, last active 30 s ago", "kernel 9b9b idle"]
    assert last == t - 30
    assert agent.kernel_signals([], t) == ([], ["no Jupyter kernels"], None)


def test_a_kernel_whose_process_is_at_work_is_busy_whatever_jupyter_says():
    t = datetime(2026, 11, 22, 4, 0, tzinfo=timezone.utc).timestamp()
    kernels = [
        {"id": "77aa01", "execution_state": "starting", "last_activity": "2026-11-22T03:50:00Z"},
        {"id": "9b9b9b", "execution_state": "idle"},
    ]
    busy, notes, _ = agent.kernel_signals(kernels, t, {"77aa01": "waiting in hrtimer_nanosleep"})
    assert busy == ["kernel 77aa busy (its process is waiting in hrtimer_nanosleep; Jupyter says starting)"]
    assert notes == ["kernel 9b9b idle"]


# A stand-in kernel: a process whose command line names its connection file, as ipykernel's does,
# and whose main thread either waits in an epoll loop (idle) or sleeps inside a "cell".
# Each prints "ready" just before it blocks, so the test waits for that rather than a guess.
KERNEL_STANDIN = {
    "idle": "import selectors; s = selectors.EpollSelector(); print('ready', flush=True); s.select(60)",
    "sleeping cell": "import time; print('ready', flush=True); time.sleep(60)",
    "computing cell": "print('ready', flush=True)\nwhile True: pass",
}


@pytest.fixture
def standin_kernels(tmp_path):
    procs = {}
    for n, (kind, code) in enumerate(KERNEL_STANDIN.items()):
        connection = tmp_path / f"kernel-{n:04d}-{kind.replace(' ', '-')}.json"
        procs[kind] = subprocess.Popen(
            [sys.executable, "-c", code, "-f", str(connection)], stdout=subprocess.PIPE, text=True
        )
    for proc in procs.values():
        assert proc.stdout.readline() == "ready\n"
    time.sleep(0.2)  # from the print to the blocking call itself
    yield {kind: f"{n:04d}-{kind.replace(' ', '-')}" for n, kind in enumerate(KERNEL_STANDIN)}
    for proc in procs.values():
        proc.kill()
        proc.wait()


def test_kernel_processes_are_found_by_connection_file_and_read_from_proc(standin_kernels):
    ids = standin_kernels
    assert set(ids.values()) <= set(agent.kernel_pids("/proc"))
    at_work = agent.kernels_at_work("/proc", [*ids.values(), "not-running"])
    assert ids["idle"] not in at_work
    assert "nanosleep" in at_work[ids["sleeping cell"]]
    assert at_work[ids["computing cell"]] == "running"


def test_an_unreadable_or_missing_process_says_nothing(tmp_path):
    assert agent.kernel_pids(str(tmp_path / "absent")) == {}
    assert agent.main_thread_at_work(str(tmp_path), 424242) is None


def test_jupyter_times_are_utc():
    assert agent.parse_jupyter_time("2026-11-22T04:07:18.123456Z") == pytest.approx(
        datetime(2026, 11, 22, 4, 7, 18, 123456, tzinfo=timezone.utc).timestamp()
    )


# --- Its configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, field",
    [
        ({"idle_minutes": 0}, "'idle_minutes' must be > 0"),
        ({"spend_cap_usd": "lots"}, "'spend_cap_usd' is 'lots'"),
        ({"spend_warn_fraction": 2}, "'spend_warn_fraction' must be in (0, 1]"),
        ({"poweroff_command": "poweroff"}, "'poweroff_command' must be a non-empty list"),
        ({"dry_run": "yes"}, "'dry_run' must be true or false"),
        ({"idle_minute": 3}, "unknown field(s) idle_minute"),
        ({"jupyter_url": ""}, "'jupyter_url' missing or empty"),
        ({"stall_after_s": 0}, "'stall_after_s' must be > 0"),
        ({"stall_action": "kill"}, "'stall_action' is 'kill'; give one of stop, warn, off"),
    ],
)
def test_a_bad_config_names_the_field(tmp_path, change, field):
    path = tmp_path / "autostop.json"
    path.write_text(json.dumps({**CONTRACT_FIELDS, "idle_minutes": 30, **change}))
    with pytest.raises(agent.ConfigError) as err:
        agent.load_config(str(path))
    assert field in str(err.value)


def test_the_host_contract_fields_have_no_copy_in_the_agent(tmp_path):
    """Jupyter's port, the token file, the unit pattern and the run folder come only from the config."""
    path = tmp_path / "autostop.json"
    path.write_text(json.dumps({"idle_minutes": 30}))
    with pytest.raises(agent.ConfigError) as err:
        agent.load_config(str(path))
    assert "'jupyter_url', 'jupyter_token_file', 'train_unit_pattern', 'run_dir' missing" in str(err.value)
    assert "host_contract_jupyter_port" in str(err.value)


def test_a_bad_config_is_logged_and_exits_2(tmp_path, capsys):
    path = tmp_path / "autostop.json"
    path.write_text("{not json")
    assert agent.main(["--config", str(path)]) == 2
    record = json.loads(capsys.readouterr().out)
    assert record["decision"] == "error" and "is not JSON" in record["reasons"][0]


# --- Notifications: the agent posts a stop to the webhook (its URL in a root-only file) -----------


class Webhook(BaseHTTPRequestHandler):
    answers: ClassVar[list[int]] = []
    bodies: ClassVar[list[dict]] = []
    requests: ClassVar[int] = 0

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Webhook.requests += 1
        code = Webhook.answers.pop(0) if Webhook.answers else 200
        if code == 200:
            Webhook.bodies.append(json.loads(body))
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


SECRET = "/hooks/s3cr3t-t0ken"


@pytest.fixture
def webhook(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Webhook.answers, Webhook.bodies, Webhook.requests = [], [], 0
    url_file = tmp_path / "notify_webhook"
    url_file.write_text(f"http://127.0.0.1:{server.server_port}{SECRET}")
    yield config(notify_webhook_file=str(url_file))
    server.shutdown()


def stop_record(**over):
    record, _ = agent.decide(config(hourly_rate_usd=1.0, spend_cap_usd=2.0, **over), seen(), state(), BOOT,
                             3 * 3600, NOW)
    return {**record, "time": "2026-11-30T07:00:00+00:00"}


def test_a_spend_cap_reached_is_posted_with_a_text_line(webhook, capsys):
    record = stop_record()
    assert record["decision"] == "stop"
    agent.notify(webhook, record, ["digits-1"], sleep=lambda _s: None)
    [body] = Webhook.bodies
    assert body["event"] == "budget_reached" and body["run"] == "digits-1"
    assert body["text"] == body["content"] and "spend cap" in body["text"] and "digits-1" in body["text"]
    assert body["cost_usd"] == record["spend_usd"] and body["vm"]
    line = json.loads(capsys.readouterr().out)
    assert line == {"action": "notify", "event": "budget_reached", "status": 200, "tries": 1}


def test_an_idle_stop_is_an_autostop_event():
    record, _ = agent.decide(config(), seen(), state(idle_since=NOW - 3600), BOOT, 3 * 3600, NOW)
    assert agent.notify_event(record, [], "vm-1")["event"] == "autostop"


def test_a_500_is_retried_then_logged_once_without_the_url(webhook, capsys):
    Webhook.answers = [500, 500, 500]
    pauses: list[float] = []
    agent.notify(webhook, stop_record(), [], sleep=pauses.append)
    assert Webhook.requests == 3 and pauses == [1.0, 2.0]
    out = capsys.readouterr().out
    assert json.loads(out) == {"action": "notify", "event": "budget_reached", "status": 500, "tries": 3}
    assert SECRET not in out


def test_a_webhook_that_is_down_is_logged_without_the_url(tmp_path, capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url_file = tmp_path / "notify_webhook"
    url_file.write_text(f"http://127.0.0.1:{port}{SECRET}")
    agent.notify(config(notify_webhook_file=str(url_file)), stop_record(), [], sleep=lambda _s: None)
    out = capsys.readouterr().out
    assert json.loads(out)["error"] and json.loads(out)["tries"] == 3 and SECRET not in out


def test_no_webhook_file_posts_nothing_and_a_bad_url_is_said(tmp_path, capsys):
    agent.notify(config(), stop_record(), [])
    assert capsys.readouterr().out == ""
    url_file = tmp_path / "notify_webhook"
    url_file.write_text("ftp://example.com/s3cr3t")
    agent.notify(config(notify_webhook_file=str(url_file)), stop_record(), [])
    out = capsys.readouterr().out
    assert "not an http(s) URL" in out and "s3cr3t" not in out
