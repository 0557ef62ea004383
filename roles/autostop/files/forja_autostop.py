#!/usr/bin/env python3
"""forja autostop agent: stop this VM when nobody uses it, when it has cost enough, or has run too long.

A systemd timer runs this once a minute (a oneshot service). Each run observes the machine,
decides, logs the decision as ONE JSON line (journald keeps it) with every reason, and, when
the decision is to stop, asks running training units to checkpoint (systemctl stop -> SIGTERM)
and powers the guest off. On GCP a guest poweroff leaves the VM TERMINATED: compute billing
stops, the disk keeps costing.

"Idle" means ALL of these, for the whole idle window:
  - no Jupyter kernel busy, and no kernel activity within the window (GET /api/kernels with the
    token in the Authorization header; an idle Colab tab keeps a websocket open but makes no
    kernel activity, so it does not keep the VM alive). Jupyter's own view can go stale: its
    activity monitor sometimes misses every status message of a kernel (it then says "starting"
    or "idle" for the whole of a long cell; seen here after a cold kernel start, and reported
    upstream, e.g. jupyter-server/enterprise_gateway#1138). So each kernel's process is looked
    at too: an idle ipykernel waits in its event loop (epoll) on the main thread; any other
    main-thread state (running, sleeping, waiting on I/O or the GPU) is a cell at work;
  - no training unit (trainer_run's forja-train@ units, the config's train_unit_pattern) active;
  - GPU utilisation under the threshold (nvidia-smi; a VM without one says "no GPU");
  - no interactive login session: a utmp entry with a TTY. An `ssh -N -L` tunnel has no TTY
    and is deliberately NOT a session (SkyPilot's autostop counts only PTYs too, but misses
    Jupyter, which is why both are checked here).

What a stop does is the config's action: poweroff (a VM: stop the training units, then power the
guest off), stop (a workstation, the user's own machine: stop the training units and shut Jupyter's
kernels down, which frees their GPU memory; the machine and the Jupyter server stay up) or warn (log
the decision only). With stop or warn the agent acts once per idle stretch: it waits for activity
before it acts again, so an idle workstation gets one line, not one a minute.

Caps that apply even when busy: the maximum runtime since boot, and the spend cap (hourly rate
x running time, summed over boots). At the warning threshold the agent writes a warning file.

A stalled run: a training unit that is active while its run's progress (the trainer's metrics
endpoint, forja_train_last_progress_timestamp_seconds, bumped by every training step AND every
evaluation batch) has not moved for stall_after_s. A hung collective, a stuck data source or a
dead lock keeps the unit "active" and the GPU billing; this is the one signal that sees it. The
agent then stops that unit (SIGTERM: the trainer checkpoints if it still can) or only warns, as
stall_action says. The endpoint's port is in <run_dir>/<run>/live.json; an endpoint that stops
answering (a hang that holds Python's lock) counts from the last progress the agent saw.

State lives in state.json, keyed by the kernel's boot id: a new boot resets the idle clock and
the per-boot spend (carried into the lifetime total), so a VM started again does not stop at
once; a boot grace period keeps every stop away right after boot.

Stdlib only, Python 3.10 (Ubuntu 22.04's python3): it runs on the host with nothing installed.
The Jupyter token is read from its file on every run and is never logged or put in a URL.

Before a poweroff, once the training units have checkpointed, the agent also leaves a record for the
controller's stopped-disk prune (`forja prune`, plugins/module_utils/forja_gcp_prune.py): the guest
attribute <namespace>/mirror, JSON listing each run on the disk with its newest checkpoint step and the
objects a checkpoint bucket must hold for it (relative to the run's prefix there: the checkpoint, the
mirror's completion marker, the run's logs and summary). A VM stopped past autostop_delete_after is
deleted only when every one of those objects is in the bucket.

Notifications: with notify_webhook_file set, a stop (idle, maximum runtime) is posted as an
"autostop" event and a spend cap reached as "budget_reached", before acting, in the JSON forja's
own events use (forja/notify.py). The webhook URL stays in its root-only file, never logged.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

# Numbers for people, the rules forja and the trainer print with (trainer/figures.py, installed
# beside this script as forja_figures.py by the role), and the names of a run folder's files
# (trainer/run_folder.py, installed as forja_run_folder.py): one home for each, stdlib only.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forja_figures as figures
import forja_run_folder as run_folder

DEFAULTS: dict[str, Any] = {
    "idle_minutes": 30.0,
    # A run whose progress has not moved for this long while its unit is active is stalled.
    "stall_after_s": 1800.0,
    # stop (the unit), warn (log only) or off.
    "stall_action": "stop",
    "boot_grace_minutes": 10.0,
    "max_runtime_hours": 0.0,
    "gpu_util_threshold": 10.0,
    # What a stop does: poweroff (the VM), stop (training units and Jupyter kernels) or warn (log only).
    "action": "poweroff",
    "poweroff_command": ["systemctl", "poweroff"],
    "dry_run": False,
    "hourly_rate_usd": 0.0,
    "spend_cap_usd": 0.0,
    "spend_warn_fraction": 0.8,
    "stop_timeout_seconds": 300,
    "state_dir": "/var/lib/forja/autostop",
    "nvidia_smi": "nvidia-smi",
    "utmp": "/run/utmp",
    "proc_root": "/proc",
    # The metadata server's base URL; empty: do not record why the VM was stopped.
    "metadata_url": "http://metadata.google.internal/computeMetadata/v1",
    # The guest attribute (NAMESPACE/KEY) that keeps the reason of the last stop, readable through
    # the Compute API while the VM is stopped (forja's inventory reads forja/*).
    "guest_attribute": "forja/autostop",
    # A root-only (0600) file holding the webhook URL the agent posts its stops to (the inventory's
    # notify_webhook, written by the role without logging it); empty: no notifications. The URL
    # itself is never in this config, the journal or a command line: it is a secret.
    "notify_webhook_file": "",
}
#: Fields the config must give: the host contract (forja.gpu.host_contract), which the role writes
#: from the one place it is defined, so no port, path or unit name of another role is copied here.
REQUIRED = ("jupyter_url", "jupyter_token_file", "train_unit_pattern", "run_dir")
#: GCE keeps guest attribute values small; a reason longer than this is cut.
MAX_REASON_BYTES = 1000
NUMBERS = (
    "idle_minutes",
    "boot_grace_minutes",
    "max_runtime_hours",
    "gpu_util_threshold",
    "hourly_rate_usd",
    "spend_cap_usd",
    "spend_warn_fraction",
    "stop_timeout_seconds",
    "stall_after_s",
)
STALL_ACTIONS = ("stop", "warn", "off")
ACTIONS = ("poweroff", "stop", "warn")
#: The trainer's live metrics (trainer/live.py): the one gauge read (run_folder.LIVE names the port).
PROGRESS_METRIC = "forja_train_last_progress_timestamp_seconds"
MIN_BILLED_S = 60.0  # Compute Engine bills at least one minute per start
#: The key, in the guest attribute's namespace, of the record for the stopped-disk prune, and its version
#: (plugins/module_utils/forja_gcp_prune.py reads it: MIRROR_ATTRIBUTE, RECORD_VERSION).
MIRROR_KEY = "mirror"
MIRROR_RECORD_VERSION = 1
#: A checkpoint's file name (trainer/checkpoint.py CKPT_RE) and the suffix of the completion marker the
#: bucket mirror writes beside it (trainer/mirror.py MARKER_SUFFIX); tests/gcp/test_prune.py pins both.
CHECKPOINT_RE = re.compile(r"^ckpt-(\d+)\.pt$")
MARKER_SUFFIX = ".complete.json"
#: The run queue (trainer_run's files/forja_queue.py): its folder inside run_dir and the status its
#: admission pass writes there (QUEUE_DIR_NAME, STATUS_FILE; tests/training/test_queue.py keeps them equal).
QUEUE_DIR = ".queue"
QUEUE_STATUS = "status.json"
#: A queue status older than this says the admission pass no longer runs (forja-queue.timer runs it every
#: 30 s): its waiting runs would never start, so they keep nothing up.
QUEUE_STALE_S = 300.0


class ConfigError(ValueError):
    """The config file is wrong; the message names the field and the fix."""


def load_config(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            given = json.load(handle)
    except FileNotFoundError as exc:
        raise ConfigError(f"config {path} does not exist; apply the autostop role to write it") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config {path} is not JSON ({exc}); re-apply the autostop role") from exc
    if not isinstance(given, dict):
        raise ConfigError(f"config {path} must be a JSON object")
    known = (*REQUIRED, *DEFAULTS)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(f"config {path}: unknown field(s) {', '.join(unknown)}; known: {', '.join(known)}")
    missing = [field for field in REQUIRED if not isinstance(given.get(field), str) or not given[field]]
    if missing:
        raise ConfigError(
            f"config {path}: {', '.join(repr(f) for f in missing)} missing or empty; re-apply the autostop role, "
            "which writes them from the host contract (host_contract_jupyter_port, host_contract_jupyter_token_file, "
            "host_contract_train_unit_pattern, host_contract_run_dir)"
        )
    config = {**DEFAULTS, **given}
    for field in NUMBERS:
        value = config[field]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"config {path}: '{field}' is {value!r}; it must be a number >= 0")
    if config["idle_minutes"] <= 0:
        raise ConfigError(f"config {path}: 'idle_minutes' must be > 0 (fractions such as 0.1 are fine)")
    if config["stall_after_s"] <= 0:
        raise ConfigError(f"config {path}: 'stall_after_s' must be > 0 seconds (stall_action off: no check)")
    if config["stall_action"] not in STALL_ACTIONS:
        raise ConfigError(
            f"config {path}: 'stall_action' is {config['stall_action']!r}; give one of "
            + ", ".join(STALL_ACTIONS)
        )
    if config["action"] not in ACTIONS:
        given_action = config["action"]
        raise ConfigError(f"config {path}: 'action' is {given_action!r}; give one of " + ", ".join(ACTIONS))
    if not 0 < config["spend_warn_fraction"] <= 1:
        raise ConfigError(f"config {path}: 'spend_warn_fraction' must be in (0, 1], e.g. 0.8")
    command = config["poweroff_command"]
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise ConfigError(f"config {path}: 'poweroff_command' must be a non-empty list of strings")
    if not isinstance(config["dry_run"], bool):
        raise ConfigError(f"config {path}: 'dry_run' must be true or false")
    url = config["metadata_url"]
    if not isinstance(url, str) or (url and not url.startswith("http://")):
        raise ConfigError(f"config {path}: 'metadata_url' is {url!r}; give an http:// URL or '' (off)")
    if not isinstance(config["notify_webhook_file"], str):
        raise ConfigError(f"config {path}: 'notify_webhook_file' must be a path or '' (off)")
    attribute = config["guest_attribute"]
    if not isinstance(attribute, str) or len(attribute.split("/")) != 2 or not all(attribute.split("/")):
        raise ConfigError(f"config {path}: 'guest_attribute' is {attribute!r}; give NAMESPACE/KEY")
    return config


# --- Observing the machine ----------------------------------------------------------------------


def boot_id() -> str:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
        return handle.read().strip()


def stat_fields(text: str) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and ")")."""
    return text.rsplit(")", 1)[1].split()


def uptime_seconds() -> float:
    """Time since PID 1 started: the VM's boot, and also right inside a container (test hosts)."""
    with open("/proc/uptime", encoding="ascii") as handle:
        system_up = float(handle.read().split()[0])
    with open("/proc/1/stat", encoding="ascii") as handle:
        fields = stat_fields(handle.read())
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: starttime in ticks
    return max(0.0, system_up - started)


def parse_jupyter_time(text: str) -> float:
    """Jupyter writes UTC ISO 8601 ("2026-11-22T04:07:18.123456Z"); return epoch seconds."""
    stamp = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def jupyter_kernels(config: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
    """The kernels Jupyter reports, or None and why they could not be read."""
    try:
        with open(config["jupyter_token_file"], encoding="utf-8") as handle:
            token = handle.read().strip()
    except FileNotFoundError:
        return [], "no Jupyter token file (Jupyter not installed)"
    except PermissionError:
        return None, f"cannot read {config['jupyter_token_file']}"
    request = urllib.request.Request(
        config["jupyter_url"].rstrip("/") + "/api/kernels",
        headers={"Authorization": f"token {token}", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            kernels = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        return None, f"Jupyter answered HTTP {exc.code} to /api/kernels"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):
            return [], "Jupyter not running"
        return None, f"Jupyter unreachable ({reason})"
    except ValueError:
        return None, "Jupyter sent a non-JSON kernel list"
    return kernels, "ok"


def training_units(pattern: str) -> list[str]:
    """Active (or starting) units matching the trainer's template, e.g. forja-train@run1.service."""
    proc = subprocess.run(
        ["systemctl", "list-units", pattern, "--state=active,activating,reloading", "--no-legend", "--plain"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def parse_gpu_utilisation(text: str) -> list[float]:
    """nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits: one number a line."""
    values = []
    for line in text.splitlines():
        line = line.strip()
        if line:
            try:
                values.append(float(line))
            except ValueError:
                continue  # "[N/A]" or "[Not Supported]": no reading for that GPU
    return values


def gpu_utilisation(nvidia_smi: str) -> tuple[list[float] | None, str]:
    if shutil.which(nvidia_smi) is None:
        return None, "no GPU"
    try:
        proc = subprocess.run(
            [nvidia_smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"nvidia-smi failed ({exc})"
    if proc.returncode != 0:
        return None, f"nvidia-smi failed (exit {proc.returncode}: {proc.stderr.strip()[:200]})"
    return parse_gpu_utilisation(proc.stdout), "ok"


UTMP_RECORD = struct.Struct("<hxxi32s4s32s256shhiii16s20s")  # glibc x86_64/aarch64 `struct utmp`
USER_PROCESS = 7


def interactive_sessions(utmp_path: str) -> list[str]:
    """Logins that hold a terminal, from utmp (sshd writes it for PTY sessions only).

    `ssh -N -L` tunnels and Ansible's non-PTY connections never appear here, on purpose.
    Entries whose process has gone (a crashed sshd) are ignored.
    """
    try:
        with open(utmp_path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    sessions = []
    for offset in range(0, len(data) - UTMP_RECORD.size + 1, UTMP_RECORD.size):
        kind, pid, line, _id, user, host, *_ = UTMP_RECORD.unpack_from(data, offset)
        if kind != USER_PROCESS or pid <= 0 or not os.path.exists(f"/proc/{pid}"):
            continue
        tty = line.split(b"\0", 1)[0].decode(errors="replace")
        name = user.split(b"\0", 1)[0].decode(errors="replace")
        origin = host.split(b"\0", 1)[0].decode(errors="replace")
        if origin:
            sessions.append(f"ssh session {tty} (user {name} from {origin})")
        else:
            sessions.append(f"login session {tty} (user {name})")
    return sessions


# Syscalls an event loop waits in, by machine, for when /proc/PID/wchan is hidden.
EPOLL_SYSCALLS = {"x86_64": {232, 281, 441}, "aarch64": {22, 441}}


def kernel_pids(proc_root: str) -> dict[str, int]:
    """Kernel id -> process id, from the ``kernel-<id>.json`` connection file on each command line."""
    pids: dict[str, int] = {}
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, entry, "cmdline"), "rb") as handle:
                args = handle.read().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        for arg in args:
            name = os.path.basename(arg.decode(errors="replace"))
            if name.startswith("kernel-") and name.endswith(".json"):
                pids.setdefault(name[len("kernel-") : -len(".json")], int(entry))
    return pids


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def main_thread_at_work(proc_root: str, pid: int) -> str | None:
    """Why a kernel process is running code, or None when its main thread waits in its event loop.

    ipykernel serves requests from an asyncio loop on the main thread and runs cells there too:
    between cells that thread sits in epoll_wait; during a cell it runs, sleeps or waits on
    something else. A process that cannot be read says nothing (None).
    """
    base = os.path.join(proc_root, str(pid))
    stat = _read(os.path.join(base, "stat"))
    if not stat:
        return None
    state = stat_fields(stat)[0]
    if state in ("R", "D"):
        return "running" if state == "R" else "in uninterruptible I/O"
    wchan = _read(os.path.join(base, "wchan"))
    if "epoll" in wchan:
        return None
    call = _read(os.path.join(base, "syscall")).split(" ", 1)[0]
    if call.isdigit() and int(call) in EPOLL_SYSCALLS.get(os.uname().machine, set()):
        return None
    if wchan and wchan != "0":
        return f"waiting in {wchan}"
    return f"in syscall {call}" if call else None


def kernels_at_work(proc_root: str, kernel_ids: list[str]) -> dict[str, str]:
    """Kernel id -> why its process is at work, for the given kernels (none given: /proc is not read)."""
    if not kernel_ids:
        return {}
    pids = kernel_pids(proc_root)
    found = {}
    for kernel_id in kernel_ids:
        if kernel_id in pids:
            why = main_thread_at_work(proc_root, pids[kernel_id])
            if why:
                found[kernel_id] = why
    return found


def kernel_signals(
    kernels: list[dict[str, Any]], now: float, at_work: dict[str, str] | None = None
) -> tuple[list[str], list[str], float | None]:
    """Busy reasons, idle notes and the latest activity from Jupyter's kernel list.

    "busy" is work, and so is a kernel whose process is at work whatever Jupyter says (see
    the module docstring). A kernel nobody has connected to can sit in "starting" for ever; its
    start time (last_activity) still opens a fresh idle window, through decide().
    """
    at_work = at_work or {}
    busy: list[str] = []
    notes: list[str] = []
    last_activity: float | None = None
    for kernel in kernels:
        short = str(kernel.get("id", "?"))[:4]
        state = kernel.get("execution_state", "unknown")
        seen = kernel.get("last_activity")
        when = parse_jupyter_time(seen) if seen else None
        if when is not None:
            last_activity = when if last_activity is None else max(last_activity, when)
        if state == "busy":
            busy.append(f"kernel {short} busy")
        elif kernel.get("id") in at_work:
            busy.append(f"kernel {short} busy (its process is {at_work[kernel['id']]}; Jupyter says {state})")
        elif when is not None:
            notes.append(f"kernel {short} {state}, last active {max(0.0, now - when):.0f} s ago")
        else:
            notes.append(f"kernel {short} {state}")
    if not kernels:
        notes.append("no Jupyter kernels")
    return busy, notes, last_activity


def queue_signals(run_dir: str, now: float) -> tuple[list[str], list[str]]:
    """The host's run queue as reasons to stay up and notes. A queued run that can start is work: the
    queue starts it as soon as the GPU frees, so the VM must not stop in that gap. A run that can never
    start (it needs more GPU memory than the GPU has; the queue fails it out with that reason) is not,
    nor is a queue whose admission has stopped looking: a queue stuck on what cannot run lets the VM stop
    instead of keeping it up forever."""
    try:
        with open(os.path.join(run_dir, QUEUE_DIR, QUEUE_STATUS), encoding="utf-8") as handle:
            status = json.load(handle)
    except (OSError, ValueError):
        return [], []
    if not isinstance(status, dict):
        return [], []
    busy: list[str] = []
    failed = sorted((status.get("failed") or {}).items())
    notes = [f"queued run {run} can never start: {why}" for run, why in failed]
    waiting = [w for w in status.get("waiting") or [] if isinstance(w, dict)]
    age = now - float(status.get("updated_at") or 0)
    if waiting and age > QUEUE_STALE_S:
        notes.append(f"run queue not looked at for {age / 60:.0f} min (forja-queue.timer stopped?): "
                     f"{len(waiting)} queued run(s) cannot start")
        return busy, notes
    for entry in waiting:
        text = f"queued run {entry.get('run')}: {entry.get('reason') or 'waits to start'}"
        (busy if entry.get("runnable", True) else notes).append(text)
    return busy, notes


def observe(config: dict[str, Any], now: float) -> dict[str, Any]:
    """Every signal, as reasons to stay up (busy), notes (why it looks idle), and the last activity.

    A kernel's last activity is not a reason by itself: it moves the start of the idle window
    (decide() takes the later of the two), so "no kernel activity for N minutes" is exact.
    """
    busy: list[str] = []
    notes: list[str] = []
    last_activity: float | None = None
    kernels, status = jupyter_kernels(config)
    if kernels is None:
        busy.append(f"kernel state unknown: {status}")
    elif status != "ok":
        notes.append(status)
    else:
        unsure = [str(k.get("id")) for k in kernels if k.get("execution_state") != "busy"]
        at_work = kernels_at_work(config["proc_root"], unsure)
        kernel_busy, kernel_notes, last_activity = kernel_signals(kernels, now, at_work)
        busy += kernel_busy
        notes += kernel_notes
    units = training_units(config["train_unit_pattern"])
    busy += [f"training unit {unit} running" for unit in units]
    if not units:
        notes.append("no training unit")
    queue_busy, queue_notes = queue_signals(config["run_dir"], now)
    busy += queue_busy
    notes += queue_notes
    utilisation, gpu_status = gpu_utilisation(config["nvidia_smi"])
    if utilisation is None:
        notes.append(gpu_status)
    else:
        threshold = config["gpu_util_threshold"]
        for index, value in enumerate(utilisation):
            text = f"GPU {index} at {value:.0f}% (threshold {threshold:.0f}%)"
            (busy if value >= threshold else notes).append(text)
    sessions = interactive_sessions(config["utmp"])
    busy += sessions
    if not sessions:
        notes.append("no interactive session")
    return {"busy": busy, "notes": notes, "last_activity": last_activity}


# --- Stalled runs ------------------------------------------------------------------------------


def unit_run(pattern: str, unit: str) -> str | None:
    """The run name in a training unit's name: what the pattern's ``*`` stands for (None: no match)."""
    prefix, star, suffix = pattern.partition("*")
    if not star or not unit.startswith(prefix) or not unit.endswith(suffix):
        return None
    return unit[len(prefix) : len(unit) - len(suffix)] or None


def progress_value(text: str, run: str) -> float | None:
    """The run's last-progress gauge from Prometheus text (one sample line; stdlib, so no client).

    The trainer serves it as ``forja_train_last_progress_timestamp_seconds{run="NAME"} VALUE``;
    a run name cannot hold spaces or quotes (the host contract's pattern), so the split is exact.
    """
    for line in text.splitlines():
        if not line.startswith(PROGRESS_METRIC + "{"):
            continue
        labels, _, rest = line[len(PROGRESS_METRIC) + 1 :].partition("}")
        if f'run="{run}"' in labels.split(","):
            try:
                return float(rest.split()[0])
            except (IndexError, ValueError):
                return None
    return None


def read_progress(run_dir: str, run: str) -> tuple[float | None, int | None, str]:
    """(last progress, serving pid, how it went) for one run, from its live.json and endpoint."""
    try:
        with open(os.path.join(run_dir, run, run_folder.LIVE), encoding="utf-8") as handle:
            served = json.load(handle)
        port, pid = int(served["port"]), int(served["pid"])
    except FileNotFoundError:
        return None, None, "no live metrics (yet)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, None, f"unreadable {run_folder.LIVE} ({exc})"
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return None, pid, f"endpoint silent ({getattr(exc, 'reason', exc)})"
    value = progress_value(text, run)
    return value, pid, "ok" if value is not None else f"no {PROGRESS_METRIC} for run {run}"


def stalled_runs(
    config: dict[str, Any], units: list[str], now: float, memory: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The active runs whose progress is older than stall_after_s, and what to remember for next time.

    ``memory`` ({run: {"pid", "progress"}}, the previous check's) stands in for an endpoint that no
    longer answers while the same process serves it: a hang holding Python's lock silences the
    server thread too. A run that has not served yet (setup) is never judged.
    """
    found: list[dict[str, Any]] = []
    remembered: dict[str, Any] = {}
    for unit in units:
        run = unit_run(config["train_unit_pattern"], unit)
        if run is None:
            continue
        progress, pid, how = read_progress(config["run_dir"], run)
        earlier = memory.get(run) or {}
        if progress is None and pid is not None and earlier.get("pid") == pid:
            progress = earlier.get("progress")
        if progress is None:
            continue
        remembered[run] = {"pid": pid, "progress": progress}
        age = max(0.0, now - progress)
        if age >= config["stall_after_s"]:
            limit = figures.duration(config["stall_after_s"])
            why = f"run {run}: no progress for {figures.duration(age)} (stalled after {limit})"
            found.append({"run": run, "unit": unit, "progress_age_s": round(age, 1),
                          "reason": why if how == "ok" else f"{why}; {how}"})  # fmt: skip
    return found, remembered


def handle_stalls(config: dict[str, Any], units: list[str], now: float) -> list[dict[str, Any]]:
    """Find stalled runs (their memory in state_dir/stalls.json) and stop or warn; the records logged."""
    if config["stall_action"] == "off" or not units:
        return []
    os.makedirs(config["state_dir"], mode=0o755, exist_ok=True)
    path = os.path.join(config["state_dir"], "stalls.json")
    memory = read_state(path) or {}
    found, remembered = stalled_runs(config, units, now, memory)
    write_json(path, remembered, 0o600)
    records = []
    for stall in found:
        action = config["stall_action"]
        if action == "stop" and config["dry_run"]:
            action = "would-stop"
        record = {"decision": "stall", "action": action, "run": stall["run"], "unit": stall["unit"],
                  "progress_age_s": stall["progress_age_s"], "reasons": [stall["reason"]]}  # fmt: skip
        log(record)
        if action == "stop":
            subprocess.run(["systemctl", "stop", stall["unit"]], check=False,
                           timeout=config["stop_timeout_seconds"] + 30)  # fmt: skip
        records.append(record)
    return records


# --- Deciding (pure: tested without a machine) -------------------------------------------------


def fresh_state(boot: str, now: float, carried_usd: float = 0.0, boots: int = 0) -> dict[str, Any]:
    return {
        "boot_id": boot,
        "idle_since": now,
        "boot_usd": 0.0,
        "prior_boots_usd": carried_usd,
        "boots": boots + 1,
        "stopping": False,
    }


def boot_spend(rate: float, uptime: float) -> float:
    return rate * max(MIN_BILLED_S, uptime) / 3600.0 if rate > 0 else 0.0


def decide(
    config: dict[str, Any],
    seen: dict[str, Any],
    state: dict[str, Any] | None,
    boot: str,
    uptime: float,
    now: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decision record and the next state, from what was observed and what was remembered."""
    reasons: list[str] = []
    if state is None or state.get("boot_id") != boot:
        carried = 0.0 if state is None else state.get("prior_boots_usd", 0.0) + state.get("boot_usd", 0.0)
        state = fresh_state(boot, now, carried, 0 if state is None else state.get("boots", 0))
        reasons.append(f"new boot {boot[:8]}: idle clock reset")
    state = dict(state)
    state["boot_usd"] = boot_spend(config["hourly_rate_usd"], uptime)
    spend = state["prior_boots_usd"] + state["boot_usd"]
    record: dict[str, Any] = {"uptime_s": round(uptime, 1), "boot_id": boot[:8]}
    if config["hourly_rate_usd"] > 0:
        record["spend_usd"] = round(spend, 4)
    stops: list[str] = []
    cap = config["spend_cap_usd"]
    warning = None
    if cap > 0 and config["hourly_rate_usd"] > 0:
        if spend >= cap:
            stops.append(
                f"spend cap {figures.money(cap)} reached (spent {figures.money(spend)} at "
                f"{figures.hourly(config['hourly_rate_usd'])})"
            )
        elif spend >= config["spend_warn_fraction"] * cap:
            warning = (
                f"spent {figures.money(spend)} of the {figures.money(cap)} cap ({spend / cap:.0%}); "
                "the VM stops at the cap: "
                "raise autostop_spend_cap_usd to keep going"
            )
            reasons.append(f"budget warning: {warning}")
    max_s = config["max_runtime_hours"] * 3600
    if max_s > 0 and uptime >= max_s:
        stops.append(f"maximum runtime {figures.duration(max_s)} reached (up {figures.duration(uptime)})")
    state["warning"] = warning
    if seen["busy"]:
        state["idle_since"] = now
    elif seen["last_activity"] is not None:
        state["idle_since"] = max(state["idle_since"], min(seen["last_activity"], now))
    idle_for = max(0.0, now - state["idle_since"])
    window = config["idle_minutes"] * 60
    record["idle_for_s"] = round(idle_for, 1)
    if not seen["busy"] and idle_for >= window:
        stops.append(f"idle for {idle_for:.0f} s (window {window:.0f} s): " + ", ".join(seen["notes"]))
    grace = config["boot_grace_minutes"] * 60
    if stops and uptime < grace:
        reasons.append(f"boot grace: up {uptime:.0f} s of {grace:.0f} s, not stopping yet")
        stops = []
    action = config["action"]
    acted = state.get("handled_idle_since") == state["idle_since"]
    if stops and action != "poweroff" and not seen["busy"] and acted:
        reasons.append(f"already acted ({action}) on this idle stretch: waiting for activity")
        stops = []
    if stops:
        decision = "would-stop" if config["dry_run"] else "warn" if action == "warn" else "stop"
        reasons += stops + seen["busy"]
        state["stopping"] = action == "poweroff" and not config["dry_run"]
        if action != "poweroff" and not config["dry_run"]:
            state["handled_idle_since"] = state["idle_since"]
        record["action"] = action
    elif seen["busy"]:
        decision = "keep"
        reasons += seen["busy"]
    else:
        decision = "idle"
        reasons.append(f"idle for {idle_for:.0f} s of {window:.0f} s: " + ", ".join(seen["notes"]))
    record = {"decision": decision, "reasons": reasons, **record}
    if stops:
        record["stop_reasons"] = stops
    if config["dry_run"]:
        record["dry_run"] = True
    return record, state


# --- Acting -------------------------------------------------------------------------------------


def log(record: dict[str, Any]) -> None:
    print(json.dumps(record, sort_keys=False), flush=True)


def write_json(path: str, data: Any, mode: int) -> None:
    """Atomic write, so a reader (or the next run) never sees half a file."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.write("\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def read_state(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            state = json.load(handle)
        return state if isinstance(state, dict) else None
    except (FileNotFoundError, ValueError):
        return None


def stop_machine(config: dict[str, Any], record: dict[str, Any]) -> int:
    """Let training checkpoint (SIGTERM through systemctl stop), leave the prune its record, then power
    the guest off."""
    units = training_units(config["train_unit_pattern"])
    if units:
        log(
            {
                "action": "stop-training",
                "units": units,
                "why": "SIGTERM: the trainer checkpoints",
            }
        )
        subprocess.run(
            ["systemctl", "stop", *units], check=False, timeout=config["stop_timeout_seconds"] + 30
        )
    record_mirror(config, time.time())
    log({"action": "poweroff", "command": config["poweroff_command"]})
    return subprocess.run(config["poweroff_command"], check=False).returncode


def jupyter_token(config: dict[str, Any]) -> str | None:
    try:
        with open(config["jupyter_token_file"], encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def shutdown_kernels(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Shut Jupyter's kernels down (DELETE /api/kernels/ID): their GPU memory is freed, the server stays.

    Only reached when nothing is busy, so every kernel listed is idle; Colab reconnects to a new one.
    """
    kernels, status = jupyter_kernels(config)
    token = jupyter_token(config)
    outcomes: list[dict[str, Any]] = []
    if not kernels or token is None:
        return [{"kernels": status}] if status != "ok" else []
    for kernel in kernels:
        kernel_id = str(kernel.get("id"))
        request = urllib.request.Request(
            f"{config['jupyter_url'].rstrip('/')}/api/kernels/{kernel_id}",
            method="DELETE",
            headers={"Authorization": f"token {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                outcomes.append({"kernel": kernel_id, "status": answer.status})
        except urllib.error.HTTPError as exc:
            outcomes.append({"kernel": kernel_id, "status": exc.code})
        except OSError as exc:
            outcomes.append({"kernel": kernel_id, "error": str(exc)})
    return outcomes


def stop_work(config: dict[str, Any]) -> int:
    """The stop action: training units checkpoint and exit, idle kernels go; the machine stays up."""
    units = training_units(config["train_unit_pattern"])
    if units:
        log({"action": "stop-training", "units": units, "why": "SIGTERM: the trainer checkpoints"})
        subprocess.run(
            ["systemctl", "stop", *units], check=False, timeout=config["stop_timeout_seconds"] + 30
        )
    kernels = shutdown_kernels(config)
    log({"action": "stop-kernels", "kernels": kernels, "why": "free the GPU; Jupyter stays up"})
    return 0


def record_stop_reason(config: dict[str, Any], record: dict[str, Any]) -> None:
    """Leave why the VM stops where it can be read while it is stopped: a guest attribute.

    The metadata server needs no credentials (it knows which VM calls); the Compute API's
    instances.getGuestAttributes reads it back. Best effort: the stop goes ahead regardless.
    """
    if not config["metadata_url"]:
        return
    reason = f"{record['time']} " + "; ".join(record.get("stop_reasons") or record["reasons"])
    data = reason.encode("utf-8")[:MAX_REASON_BYTES]
    outcome = put_guest_attribute(config, config["guest_attribute"], data)
    log({"action": "record-stop-reason", "guest_attribute": config["guest_attribute"], **outcome})


def put_guest_attribute(config: dict[str, Any], attribute: str, data: bytes) -> dict[str, Any]:
    """PUT one guest attribute (NAMESPACE/KEY) on the metadata server; how it went, for the journal."""
    url = f"{config['metadata_url'].rstrip('/')}/instance/guest-attributes/{attribute}"
    request = urllib.request.Request(url, data=data, method="PUT", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return {"status": answer.status}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "error": exc.read(300).decode("utf-8", errors="replace")}
    except OSError as exc:
        return {"error": str(exc)}


def run_claim(folder: str, run: str) -> dict[str, Any] | None:
    """One run folder's newest checkpoint step and the objects its bucket prefix must hold (None: the
    run has nothing a bucket would keep). The names are the mirror's layout (trainer/mirror.py)."""
    checkpoints = os.path.join(folder, run_folder.CHECKPOINTS_DIR)
    try:
        names = os.listdir(checkpoints)
    except OSError:
        names = []
    steps = [int(found.group(1)) for found in map(CHECKPOINT_RE.match, names) if found]
    step = max(steps) if steps else None
    objects = []
    if step is not None:
        newest = f"{run_folder.CHECKPOINTS_DIR}/ckpt-{step}.pt"
        objects += [newest, newest + MARKER_SUFFIX]
    for name in (*run_folder.LOGS, run_folder.SUMMARY):
        if os.path.isfile(os.path.join(folder, name)):
            objects.append(f"{run_folder.LOGS_DIR}/{name}")
    return {"run": run, "step": step, "objects": objects} if objects else None


def mirror_record(run_dir: str, now: float, limit: int = MAX_REASON_BYTES) -> dict[str, Any]:
    """The stopped-disk prune's record: every run on the disk, newest first, with what the bucket must
    hold for it. Runs that do not fit in `limit` bytes are left out and `more` says so: the prune then
    keeps the VM (a doubt), never deletes it."""
    try:
        entries = [e for e in os.scandir(run_dir) if e.is_dir() and not e.name.startswith(".")]
    except OSError:
        entries = []
    entries.sort(key=lambda e: e.stat().st_mtime, reverse=True)
    claims = [c for c in (run_claim(e.path, e.name) for e in entries) if c is not None]
    stamp = dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="seconds")
    record = {"v": MIRROR_RECORD_VERSION, "time": stamp, "runs": claims, "more": False}
    while claims and len(json.dumps(record, separators=(",", ":"))) > limit:
        claims.pop()
        record["more"] = True
    return record


def record_mirror(config: dict[str, Any], now: float) -> None:
    """Leave the record for the controller's stopped-disk prune (see the module's docstring), after the
    training units checkpointed. Best effort: without it the prune keeps the VM, the safe side."""
    if not config["metadata_url"]:
        return
    attribute = f"{config['guest_attribute'].split('/')[0]}/{MIRROR_KEY}"
    try:
        record = mirror_record(config["run_dir"], now)
    except Exception as exc:  # a run folder that vanished mid-scan: no record, and the poweroff goes on
        why = f"{type(exc).__name__}: {exc}"
        log({"action": "record-mirror", "guest_attribute": attribute, "error": why})
        return
    outcome = put_guest_attribute(config, attribute, json.dumps(record, separators=(",", ":")).encode())
    log({"action": "record-mirror", "guest_attribute": attribute, "runs": [c["run"] for c in record["runs"]],
         "more": record["more"], **outcome})


NOTIFY_TRIES = 3
NOTIFY_TIMEOUT_S = 5.0


def notify_event(record: dict[str, Any], runs: list[str], vm: str) -> dict[str, Any]:
    """The webhook's JSON for a stop: the same fields as forja's own events (forja/notify.py), with
    `text` (Slack) and `content` (Discord) holding the line a person reads."""
    reasons = record.get("stop_reasons") or record.get("reasons") or []
    kind = "budget_reached" if any(r.startswith("spend cap") for r in reasons) else "autostop"
    action = record.get("action", "")
    what = {"poweroff": "powers the VM off", "stop": "stops the training and Jupyter's kernels",
            "warn": "warns (action warn: nothing stopped)"}.get(action, action)
    text = f"{vm}: autostop {what}: " + "; ".join(reasons)
    if runs:
        text += f" (run {', '.join(runs)} checkpoints)"
    return {
        "event": kind, "run": ", ".join(runs), "vm": vm, "text": text, "content": text[:2000],
        "cost_usd": record.get("spend_usd"), "time": record.get("time"),
        "details": {"action": action, "reasons": reasons, "uptime_s": record.get("uptime_s")},
    }


def notify(config: dict[str, Any], record: dict[str, Any], runs: list[str],
           sleep: Any = time.sleep) -> None:
    """Post the stop to the webhook before acting: a few tries with backoff (1 s, 2 s), 5 s each,
    so a dead receiver delays the stop by seconds, never stops it. One journal line says how it
    went, never the URL."""
    path = config["notify_webhook_file"]
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as handle:
            url = handle.read().strip()
    except OSError as exc:
        log({"action": "notify", "error": f"webhook file unreadable ({type(exc).__name__})"})
        return
    if not url.startswith(("http://", "https://")):
        log({"action": "notify", "error": "the webhook is not an http(s) URL; set notify_webhook and "
             "re-apply the autostop role"})
        return
    body = notify_event(record, runs, socket.gethostname())
    outcome: dict[str, Any] = {}
    for attempt in range(1, NOTIFY_TRIES + 1):
        request = urllib.request.Request(
            url, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "forja-autostop"},
        )
        try:
            with urllib.request.urlopen(request, timeout=NOTIFY_TIMEOUT_S) as answer:
                outcome = {"status": answer.status, "tries": attempt}
                break
        except urllib.error.HTTPError as exc:
            outcome = {"status": exc.code, "tries": attempt}
        except (OSError, ValueError) as exc:  # the reason only: urllib's message may quote the URL
            outcome = {"error": type(exc).__name__, "tries": attempt}
        if attempt < NOTIFY_TRIES:
            sleep(2.0 ** (attempt - 1))
    log({"action": "notify", "event": body["event"], **outcome})


def run_once(config: dict[str, Any]) -> int:
    state_dir = config["state_dir"]
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    state_path = os.path.join(state_dir, "state.json")
    warning_path = os.path.join(state_dir, "warning")
    now = time.time()
    previous = read_state(state_path)
    boot = boot_id()
    if previous and previous.get("boot_id") == boot and previous.get("stopping"):
        log({"decision": "stopping", "reasons": ["a stop is already under way"]})
        return 0
    seen = observe(config, now)
    record, state = decide(config, seen, previous, boot, uptime_seconds(), now)
    record["time"] = dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="seconds")
    warning = state.pop("warning", None)
    if warning:
        with open(warning_path, "w", encoding="utf-8") as handle:
            handle.write(warning + "\n")
        os.chmod(warning_path, 0o644)
    elif os.path.exists(warning_path) and config["spend_cap_usd"] > 0 and record["decision"] != "stop":
        os.remove(warning_path)  # the cap was raised (or the warning no longer applies)
    write_json(state_path, state, 0o600)
    log(record)
    if record["decision"] in ("stop", "warn"):
        write_json(os.path.join(state_dir, "last_stop.json"), record, 0o644)
        if config["notify_webhook_file"]:  # said before acting: a powered-off VM posts nothing
            pattern = config["train_unit_pattern"]
            runs = [r for r in (unit_run(pattern, u) for u in training_units(pattern)) if r]
            notify(config, record, runs)
    if record["decision"] == "stop" and config["action"] == "stop":
        return stop_work(config)
    if record["decision"] == "stop":
        record_stop_reason(config, record)
        return stop_machine(config, record)
    handle_stalls(config, training_units(config["train_unit_pattern"]), now)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", default="/etc/forja/autostop.json")
    parser.add_argument("--dry-run", action="store_true", help="decide and log, never stop")
    parser.add_argument("--record-mirror", action="store_true",
                        help="only leave the stopped-disk prune's record (forja/mirror) and exit: for a stop "
                        "that is not autostop's, e.g. run before `forja down`")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        log({"decision": "error", "reasons": [str(exc)]})
        return 2
    if args.record_mirror:
        record_mirror(config, time.time())
        return 0
    if args.dry_run:
        config["dry_run"] = True
    return run_once(config)


if __name__ == "__main__":
    sys.exit(main())
