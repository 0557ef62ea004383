#!/usr/bin/python3
"""forja_queue.py: the run queue of one host, kept as files on its disk and driven by systemd.

    forja_queue.py [--config FILE] add RUN [--priority N] [--gpu-memory 10GiB] [--planned-memory 9GiB]
                                            [--timeout-s S] [--queued-at UNIX_TIME]
    forja_queue.py [--config FILE] admit          # one admission pass (forja-queue.service)
    forja_queue.py [--config FILE] list           # the queue as one JSON document
    forja_queue.py [--config FILE] cancel RUN     # a waiting run leaves; a running one is killed
    forja_queue.py [--config FILE] move RUN (--priority N | --first)

Why files and systemd, not a daemon: the training units already are systemd's (forja-train@RUN), and
a queue that is a folder of small JSON files survives a reboot, can be mirrored to a bucket with the
run folders, and needs nothing kept alive. A queued run is set up like any other (its env file and
spec in /etc/forja/train), but its unit is neither enabled nor started: its entry waits in
<run_dir>/.queue/<RUN>.json. forja-queue.service (a oneshot running `admit`) decides who starts; it
runs when an entry is added, moved or cancelled (those commands start it), when a training unit
goes down for good (its OnSuccess=/OnFailure=), and every 30 s from forja-queue.timer (timeouts;
10 s after boot).
Admission enables and starts the run's unit, so after a reboot a started run resumes with its unit
(as every run does) and the runs still waiting keep waiting in their order: nothing is lost.

The decision (`decide`) is pure: entries, the runs holding the GPU and its memory in, what to
start and what to fail out. Its rules:
  - Order: higher `priority` first, then first come first served (`seq`).
  - Admission by GPU memory: a run with a known peak (declared: --gpu-memory or `gpu_memory:` in
    the run spec; else the peak an earlier run of the same spec reached, plus CONTEXT_MIB for the
    CUDA context; else the trainer's own plan of its config, --planned-memory, which forja sends from
    `forja plan`'s kept plan) starts when it fits beside what runs; a run with no known peak, or beside a run
    with none, takes the GPU alone. A GPU whose memory is unknown is taken by one run at a time.
  - No head-of-line blocking: a run that fits passes one that does not. Never starving: each pass
    counts; once a waiting run has been passed MAX_PASSES times, or has waited AGING_S, nothing
    behind it starts until it has.
  - A run that can never fit (it needs more than the whole GPU) fails at once, with its reason; one
    still waiting after its own timeout (0: none) fails with what it waited for.
  - A run queued again after a zone move (`add --queued-at`: the managed watcher sends the mirrored
    entries to the new VM) keeps the time it was first queued: its wait goes on counting, and it ages
    towards its turn from then. Its timeout counts from when this host queued it (`requeued_at`): the
    move's outage was no fault of what it waits for.
The memory used beside is what the running runs declared or were estimated at, not nvidia-smi's
current use: a run's use grows after its start, and admission must not double-book its peak.

Mirrored to the bucket, when the role names one (the run checkpoints' trainer_run_checkpoint_bucket): after
each admission pass that changed an entry, the whole queue goes to gs://BUCKET/PREFIX/.queue/<host>.json
(one object, replaced whole; best effort, a failed upload is retried at the next pass). A reboot or a
preemption keeps the queue on the disk; a zone move makes a new disk, and the managed watcher sends the
mirrored entries again to the new VM (forja/queue.py `restore`).

status.json in the queue folder says, after each pass, which waiting runs can run (the autostop
agent counts those as work) and which cannot. A run's own folder gets queue.json when it is
admitted (when it was queued, how long it waited) or failed out of the queue (why); forja-train-state
reads both, and the entries, for the "queued" status.

Standard library only: the host's system Python runs it, before any venv exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import glob
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

#: The queue folder's name, inside the host contract's run_dir (beside the run folders; a name that
#: is no run name). The autostop agent reads STATUS_FILE there: tests/training/test_queue.py keeps
#: forja_autostop.py's copy of both names equal to these.
QUEUE_DIR_NAME = ".queue"
STATUS_FILE = "status.json"
#: The file a run's folder gets when it leaves the queue (admitted, failed out or cancelled).
RUN_FILE = "queue.json"
LOCK_FILE = ".lock"
#: The queue as last mirrored to the bucket (a dot name: never read as an entry).
MIRRORED_FILE = ".mirrored.json"
#: The mirror's version and where it goes under the bucket's prefix (forja/queue.py reads both from here).
MIRROR_VERSION = 1
MIRROR_DIR = QUEUE_DIR_NAME
#: Cloud Storage's JSON API, and where a VM's service account gets its token (no key on the VM).
STORAGE_API = "https://storage.googleapis.com"
TOKEN_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
MIRROR_TIMEOUT_S = 5
#: The role writes this config (roles/trainer_run/tasks/unit.yml): run_dir, conf_dir, gpu_memory_mib.
CONFIG = "/etc/forja/queue.json"
#: Passes a waiting run tolerates before nothing behind it may start, and seconds it waits before the same.
MAX_PASSES = 3
AGING_S = 300
#: What CUDA and PyTorch take on a GPU before the first tensor (the L4 measures about 500 MB): added to an
#: earlier run's measured peak, which counts the allocator's memory only.
CONTEXT_MIB = 512
DEFAULT_TIMEOUT_S = 600
#: Seconds an admitted run holds its slot before its unit must be seen up (systemd starts it in the
#: background).
START_GRACE_S = 60
UNIT = "forja-train@{}.service"
HOLDING = ("active", "activating", "deactivating", "reloading")
MIB = 1 << 20


# --- the decision (pure) --------------------------------------------------------------------------


def fmt_mib(mib: float) -> str:
    """23034 -> '22.5 GiB'; 900 -> '900 MiB'."""
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{int(mib)} MiB"


def fmt_wait(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{int(seconds)} s"


def ordered(entries):
    """The waiting entries in admission order: higher priority first, then first queued first."""
    return sorted((e for e in entries if not e.get("admitted_at")),
                  key=lambda e: (-int(e.get("priority") or 0), e.get("seq", 0)))


def decide(entries, holders, capacity_mib, now):
    """One admission pass.

    entries: the queue's entries (dicts: run, seq, priority, gpu_memory_mib or None, timeout_s,
    enqueued_at, passed, admitted_at). holders: {run: peak MiB or None} of the runs on the GPU now.
    capacity_mib: the GPU's memory, or None when unknown. Returns a dict:
    admit [runs, in order], fail {run: reason}, passed {run: new pass count}, waiting [{run, runnable,
    reason}] for what stays queued (runnable false: it can never start as things are).
    """
    holding = dict(holders)
    admit, fail, passed, waiting = [], {}, {}, []
    skipped = []   # entries that stay waiting this pass, ahead of whatever is admitted next
    reserved = None  # a waiting run that nothing behind may pass any more
    for entry in ordered(entries):
        run, mem = entry["run"], entry.get("gpu_memory_mib")
        age = now - float(entry.get("enqueued_at") or now)
        here = now - float(entry.get("requeued_at") or entry.get("enqueued_at") or now)  # on this host
        timeout = float(entry.get("timeout_s", DEFAULT_TIMEOUT_S) or 0)  # 0: it may wait for ever
        if capacity_mib is not None and mem is not None and mem > capacity_mib:
            fail[run] = f"needs {fmt_mib(mem)}, the GPU has {fmt_mib(capacity_mib)}"
            continue
        if reserved is None and fits(mem, holding, capacity_mib):
            admit.append(run)
            holding[run] = mem
            for ahead in skipped:
                passed[ahead["run"]] = passed.get(ahead["run"], int(ahead.get("passed") or 0)) + 1
            continue
        why = (f"waits for {reserved} to start first (passed {MAX_PASSES} times, or waiting "
               f"{fmt_wait(AGING_S)})") if reserved else blocked_by(mem, holding, capacity_mib)
        if timeout and here >= timeout:
            fail[run] = f"waited {fmt_wait(age)} (its queue timeout): {why}"
            continue
        waiting.append({"run": run, "runnable": True, "reason": why})
        skipped.append(entry)
        if reserved is None and (int(entry.get("passed") or 0) >= MAX_PASSES or age >= AGING_S):
            reserved = run
    return {"admit": admit, "fail": fail, "passed": passed, "waiting": waiting}


def fits(mem, holding, capacity_mib):
    """Whether a run of peak `mem` (None: unknown) may start beside the `holding` runs."""
    if not holding:
        return True
    if mem is None or capacity_mib is None or any(m is None for m in holding.values()):
        return False
    return sum(holding.values()) + mem <= capacity_mib


def blocked_by(mem, holding, capacity_mib):
    """Why a run that does not fit waits, naming the runs it waits behind."""
    names = ", ".join(sorted(holding))
    if mem is None:
        return f"its GPU memory is unknown, so it takes the GPU alone, after {names}"
    if capacity_mib is None:
        return f"the GPU's memory is unknown, so one run at a time; behind {names}"
    alone = sorted(r for r, m in holding.items() if m is None)
    if alone:
        return f"behind {', '.join(alone)}, whose GPU memory is unknown (it holds the GPU alone)"
    free = capacity_mib - sum(holding.values())
    return f"needs {fmt_mib(mem)}, {fmt_mib(max(free, 0))} free beside {names}"


def parse_memory(text):
    """'10GiB', '10 GB', '900MiB', '900' (MiB) -> MiB (int); a ValueError naming the forms."""
    units = {"": 1, "mib": 1, "mb": 1e6 / MIB, "gib": 1024, "gb": 1e9 / MIB, "tib": 1 << 20, "tb": 1e12 / MIB}
    raw = str(text).strip().lower().replace(" ", "")
    number = raw.rstrip("abgimt")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise ValueError(f"{text!r} is not an amount of GPU memory; give e.g. 10GiB, 10GB, 900MiB")
    return int(-(-value * units[unit] // 1))


# --- the host (files, systemd) ------------------------------------------------------------------


def load_config(path):
    """The role's settings (run_dir: the host contract's, which the role writes here; no copy of it in this
    script). A host set up before the queue has no file: its runs were never queued."""
    config = {"conf_dir": "/etc/forja/train", "gpu_memory_mib": None, "nvidia_smi": "nvidia-smi",
              "bucket": "", "storage_emulator_host": "", "host": os.uname().nodename}
    with contextlib.suppress(OSError, ValueError), open(path, encoding="utf-8") as fh:
        config.update(json.load(fh))
    return config


def queue_dir(config):
    return os.path.join(config["run_dir"], QUEUE_DIR_NAME)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def write_json(path, data):
    """Whole or not at all: a reader sees the old file or the new one."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def entries(config):
    found = []
    for path in sorted(glob.glob(os.path.join(queue_dir(config), "*.json"))):
        if os.path.basename(path) == STATUS_FILE:
            continue
        entry = read_json(path)
        if isinstance(entry, dict) and entry.get("run"):
            found.append(entry)
    return found


@contextlib.contextmanager
def locked(config):
    """One writer of the queue at a time (add, admit, cancel, move)."""
    folder = queue_dir(config)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    with open(os.path.join(folder, LOCK_FILE), "w", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def gpu_capacity(config):
    """The smallest GPU's memory in MiB (each process of a run has a GPU of its own): nvidia-smi's,
    else the config's gpu_memory_mib (trainer_run_gpu_capacity_mib: a host without a GPU, the sandbox's),
    else None."""
    try:
        query = [config["nvidia_smi"], "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
        proc = subprocess.run(query,
                              capture_output=True, text=True, timeout=20, check=False)
        sizes = [int(float(word)) for word in proc.stdout.split()] if proc.returncode == 0 else []
    except (OSError, ValueError, subprocess.TimeoutExpired):
        sizes = []
    if sizes:
        return min(sizes)
    given = config.get("gpu_memory_mib")
    return int(given) if given else None


def unit_states(runs):
    """{run: (ActiveState, UnitFileState)} in one systemctl call."""
    if not runs:
        return {}
    units = [UNIT.format(r) for r in runs]
    proc = subprocess.run(["systemctl", "show", "-p", "Id,ActiveState,UnitFileState", *units],
                          capture_output=True, text=True, check=False)
    states, block = {}, {}
    for line in [*proc.stdout.splitlines(), ""]:
        if line.strip():
            key, _, value = line.partition("=")
            block[key] = value
            continue
        unit = block.get("Id", "")
        if unit.startswith("forja-train@") and unit.endswith(".service"):
            name = unit[len("forja-train@"):-len(".service")]
            states[name] = (block.get("ActiveState", ""), block.get("UnitFileState", ""))
        block = {}
    return states


def booting():
    proc = subprocess.run(["systemctl", "is-system-running"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() in ("initializing", "starting")


def holders(config, queue, now):
    """{run: peak MiB or None} of the runs on the GPU: every set-up run whose unit is up (or enabled
    and about to come up at boot), whether it came through the queue or not. A run admitted less than
    START_GRACE_S ago holds its slot even before systemd has started its unit."""
    waiting = {e["run"] for e in queue if not e.get("admitted_at")}
    admitted = {e["run"]: e.get("gpu_memory_mib") for e in queue if e.get("admitted_at")}
    fresh = {e["run"] for e in queue
             if e.get("admitted_at") and now - float(e["admitted_at"]) < START_GRACE_S}
    runs = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(config["conf_dir"], "*.env")))
    runs = [r for r in runs if r not in waiting]
    states = unit_states(runs)
    starting = None
    found = {}
    for run in runs:
        active, enabled = states.get(run, ("", ""))
        completed = os.path.exists(os.path.join(config["run_dir"], run, "COMPLETED"))
        if run in fresh and active == "inactive" and not completed:
            pass  # admitted a moment ago: systemd has not started it yet
        elif active not in HOLDING:
            if active != "inactive" or enabled != "enabled" or completed:
                continue
            starting = booting() if starting is None else starting
            if not starting:
                continue
        found[run] = admitted.get(run)
    return found


def earlier_peak(config, run):
    """The highest GPU memory (MiB, plus CONTEXT_MIB) an earlier run of the same spec reached, from its
    metrics (gpu_mem_gb, the allocator's peak); None without one."""
    spec = os.path.join(config["conf_dir"], run + ".yaml")
    try:
        with open(spec, "rb") as fh:
            mine = fh.read()
    except OSError:
        return None
    best = None
    for other in glob.glob(os.path.join(config["conf_dir"], "*.yaml")):
        if other == spec:
            continue
        with contextlib.suppress(OSError):
            with open(other, "rb") as fh:
                if fh.read() != mine:
                    continue
            name = os.path.basename(other)[:-5]
            with open(os.path.join(config["run_dir"], name, "metrics.jsonl"), encoding="utf-8") as fh:
                for line in fh:
                    with contextlib.suppress(ValueError, AttributeError):
                        gb = json.loads(line).get("gpu_mem_gb")
                        if isinstance(gb, (int, float)) and gb > 0:
                            best = max(best or 0.0, gb)
    return None if best is None else int(best * 1e9 / MIB) + CONTEXT_MIB


def spec_memory(config, run):
    """`gpu_memory:` at the top of the run's spec (a user's command), read without YAML: one scalar line."""
    spec = os.path.join(config["conf_dir"], run + ".yaml")
    with contextlib.suppress(OSError), open(spec, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("gpu_memory:"):
                return parse_memory(line.split(":", 1)[1].split("#")[0].strip().strip("'\""))
    return None


def kick():
    """Ask systemd for an admission pass, without waiting for it."""
    subprocess.run(["systemctl", "--no-block", "start", "forja-queue.service"], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def leave(config, run, outcome, **fields):
    """Note in the run's folder how it left the queue (forja-train-state reads it)."""
    folder = os.path.join(config["run_dir"], run)
    if os.path.isdir(folder):
        write_json(os.path.join(folder, RUN_FILE), {"outcome": outcome, **fields})


def add(config, run, priority, gpu_memory_mib, timeout_s, now, planned_mib=None, queued_at=None):
    """Queue a set-up run (its env file exists); an entry already there keeps its place. Prints what
    happened. `planned_mib`, the trainer's plan, counts only when nothing else knows the run's peak: a
    declared peak is the user's word, and an earlier run's is measured. `queued_at`: when the run was
    first queued, on the VM a zone move replaced (never later than now: another host's clock)."""
    path = os.path.join(queue_dir(config), run + ".json")
    with locked(config):
        old = read_json(path)
        if old:
            print(json.dumps({"run": run, "queued": False, "why": "already in the queue"}))
            return 0
        source = "declared"
        if gpu_memory_mib is None:
            gpu_memory_mib, source = spec_memory(config, run), "run spec"
        if gpu_memory_mib is None:
            gpu_memory_mib, source = earlier_peak(config, run), "an earlier run of the same spec"
        if gpu_memory_mib is None and planned_mib is not None:
            gpu_memory_mib, source = planned_mib, "planned"
        if gpu_memory_mib is None:
            source = None
        seq = max([int(e.get("seq", 0)) for e in entries(config)] + [0]) + 1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(config["run_dir"], run, RUN_FILE))
        first = {"enqueued_at": now}
        if queued_at is not None:
            first = {"enqueued_at": min(float(queued_at), now), "requeued_at": now}
        write_json(path, {"run": run, "seq": seq, "priority": int(priority), "gpu_memory_mib": gpu_memory_mib,
                          "memory_source": source, "timeout_s": int(timeout_s), **first,
                          "passed": 0, "admitted_at": None})
    print(json.dumps({"run": run, "queued": True, "seq": seq, "gpu_memory_mib": gpu_memory_mib}))
    kick()
    return 0


def admit(config, now):
    """One pass: free the slots of runs that ended, fail what cannot or did not start in time, start
    what fits, and write status.json."""
    with locked(config):
        queue = entries(config)
        held = holders(config, queue, now)
        folder = queue_dir(config)
        for entry in [e for e in queue if e.get("admitted_at") and e["run"] not in held]:
            os.unlink(os.path.join(folder, entry["run"] + ".json"))   # it ended: its slot is free
        queue = [e for e in queue if not e.get("admitted_at") or e["run"] in held]
        capacity = gpu_capacity(config)
        decision = decide(queue, held, capacity, now)
        by_run = {e["run"]: e for e in queue}
        for run, reason in decision["fail"].items():
            entry = by_run[run]
            leave(config, run, "failed", reason=reason, enqueued_at=entry["enqueued_at"], ended_at=now,
                  waited_s=round(now - entry["enqueued_at"]), priority=entry.get("priority", 0))
            os.unlink(os.path.join(folder, run + ".json"))
            print(f"forja-queue: {run} failed out of the queue: {reason}")
        for run, count in decision["passed"].items():
            write_json(os.path.join(folder, run + ".json"), {**by_run[run], "passed": count})
        for run in decision["admit"]:
            entry = {**by_run[run], "admitted_at": now}
            write_json(os.path.join(folder, run + ".json"), entry)
            leave(config, run, "admitted", enqueued_at=entry["enqueued_at"], admitted_at=now,
                  waited_s=round(now - entry["enqueued_at"]), priority=entry.get("priority", 0),
                  gpu_memory_mib=entry.get("gpu_memory_mib"), memory_source=entry.get("memory_source"))
            subprocess.run(["systemctl", "enable", UNIT.format(run)], check=False, capture_output=True)
            subprocess.run(["systemctl", "--no-block", "start", UNIT.format(run)], check=False)
            print(f"forja-queue: started {run} after {fmt_wait(now - entry['enqueued_at'])} in the queue")
        running = sorted(set(held) | set(decision["admit"]))
        status = {"updated_at": now, "gpu_memory_mib": capacity, "running": running,
                  "waiting": decision["waiting"], "failed": decision["fail"]}
        write_json(os.path.join(folder, STATUS_FILE), status)
    mirror(config, now)  # outside the lock: the network never holds up an add or a cancel
    return 0


def mirror_document(config, now):
    """The queue as the bucket keeps it: every entry (running first, then waiting in order), for the
    managed watcher to send again after a zone move."""
    queue = entries(config)
    running = sorted((e for e in queue if e.get("admitted_at")), key=lambda e: float(e["admitted_at"]))
    return {"forja_queue_mirror": MIRROR_VERSION, "host": config["host"], "updated_at": now,
            "entries": [*running, *ordered(queue)]}


def mirror_object(bucket_url, host):
    """(bucket, object name) of a host's mirrored queue under gs://BUCKET/PREFIX."""
    bucket, _, prefix = bucket_url[len("gs://"):].partition("/")
    prefix = prefix.strip("/")
    return bucket, "/".join(p for p in (prefix, MIRROR_DIR, f"{host}.json") if p)


def mirror(config, now):
    """Upload the queue to the bucket when it changed since the last upload; best effort (one journal
    line when it fails; the next pass tries again). Nothing without a bucket."""
    url = config.get("bucket") or ""
    if not url.startswith("gs://"):
        return False
    document = mirror_document(config, now)
    last = os.path.join(queue_dir(config), MIRRORED_FILE)
    kept = read_json(last) or {}
    if kept.get("entries") == document["entries"] and kept.get("host") == document["host"]:
        return False
    bucket, name = mirror_object(url, config["host"])
    endpoint = (config.get("storage_emulator_host") or STORAGE_API).rstrip("/")
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    headers = {"Content-Type": "application/json"}
    try:
        if not config.get("storage_emulator_host"):
            headers["Authorization"] = "Bearer " + access_token()
        target = f"{endpoint}/upload/storage/v1/b/{urllib.parse.quote(bucket)}/o?{query}"
        request = urllib.request.Request(target, data=json.dumps(document, sort_keys=True).encode(),
                                         method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=MIRROR_TIMEOUT_S):
            pass
    except (OSError, ValueError, KeyError) as exc:  # HTTPError is an OSError; the reason, never a token
        print(f"forja-queue: the queue was not mirrored to gs://{bucket}/{name} ({type(exc).__name__}: "
              f"{str(exc)[:200]}); the next pass tries again")
        return False
    write_json(last, document)
    return True


def access_token():
    """The VM's service account token, from the metadata server (as Google's own libraries get it)."""
    request = urllib.request.Request(TOKEN_URL, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=MIRROR_TIMEOUT_S) as answer:
        return json.load(answer)["access_token"]


def listing(config, now):
    """The queue as forja reads it: running and waiting entries in order, with their position and wait."""
    queue = entries(config)
    status = read_json(os.path.join(queue_dir(config), STATUS_FILE)) or {}
    reasons = {w["run"]: w.get("reason", "") for w in status.get("waiting", [])}
    rows = [{**e, "state": "running", "position": 0} for e in queue if e.get("admitted_at")]
    for position, entry in enumerate(ordered(queue), 1):
        rows.append({**entry, "state": "queued", "position": position,
                     "waited_s": round(now - float(entry.get("enqueued_at") or now)),
                     "reason": reasons.get(entry["run"], "")})
    return {"forja_queue": 1, "gpu_memory_mib": status.get("gpu_memory_mib"), "entries": rows}


def cancel(config, run, now):
    """A waiting run leaves the queue; a running one is killed, all of its processes (the unit's
    cgroup), kept from resuming at boot, and its slot freed. Prints what happened."""
    path = os.path.join(queue_dir(config), run + ".json")
    with locked(config):
        entry = read_json(path)
        unit = UNIT.format(run)
        active = unit_states([run]).get(run, ("", ""))[0]
        if entry and not entry.get("admitted_at"):
            os.unlink(path)
            leave(config, run, "cancelled", enqueued_at=entry["enqueued_at"], ended_at=now,
                  waited_s=round(now - entry["enqueued_at"]), priority=entry.get("priority", 0))
            print(json.dumps({"run": run, "cancelled": "queued"}))
        elif entry or active in HOLDING:
            subprocess.run(["systemctl", "disable", unit], check=False, capture_output=True)
            subprocess.run(["systemctl", "kill", "--kill-whom=all", "--signal=SIGKILL", unit], check=False,
                           capture_output=True)
            subprocess.run(["systemctl", "stop", unit], check=False, capture_output=True)
            subprocess.run(["systemctl", "reset-failed", unit], check=False, capture_output=True)
            if entry:
                os.unlink(path)
            queued_at = {"enqueued_at": entry["enqueued_at"]} if entry else {}
            leave(config, run, "cancelled", ended_at=now, **queued_at)
            print(json.dumps({"run": run, "cancelled": "running"}))
        else:
            why = "neither queued nor running on this host"
            print(json.dumps({"run": run, "cancelled": None, "why": why}))
            return 3
    kick()
    return 0


def move(config, run, priority, first):
    """Reorder a waiting run: a new priority, or first among those of its priority."""
    path = os.path.join(queue_dir(config), run + ".json")
    with locked(config):
        entry = read_json(path)
        if not entry or entry.get("admitted_at"):
            print(json.dumps({"run": run, "moved": False, "why": "not waiting in this host's queue"}))
            return 3
        if priority is not None:
            entry["priority"] = int(priority)
        if first:
            level = int(entry.get("priority") or 0)
            same = [e for e in entries(config) if int(e.get("priority") or 0) == level]
            entry["seq"] = min([int(e.get("seq", 0)) for e in same] + [int(entry["seq"])]) - 1
        write_json(path, entry)
    print(json.dumps({"run": run, "moved": True, "priority": entry["priority"], "seq": entry["seq"]}))
    kick()
    return 0


def main(argv):
    parser = argparse.ArgumentParser(prog="forja_queue.py", description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--config", default=CONFIG)
    sub = parser.add_subparsers(dest="command", required=True)
    p_add = sub.add_parser("add")
    p_add.add_argument("run")
    p_add.add_argument("--priority", type=int, default=0)
    p_add.add_argument("--gpu-memory", type=parse_memory,
                       help="the run's peak, e.g. 10GiB (a bare number: MiB)")
    p_add.add_argument("--planned-memory", type=parse_memory,
                       help="the trainer's planned peak (forja plan), used when nothing else gives one")
    p_add.add_argument("--timeout-s", type=int, default=DEFAULT_TIMEOUT_S)
    p_add.add_argument("--queued-at", type=float,
                       help="when the run was first queued (Unix time), on the VM a zone move replaced")
    sub.add_parser("admit")
    sub.add_parser("list")
    p_cancel = sub.add_parser("cancel")
    p_cancel.add_argument("run")
    p_move = sub.add_parser("move")
    p_move.add_argument("run")
    p_move.add_argument("--priority", type=int)
    p_move.add_argument("--first", action="store_true")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    if not config.get("run_dir"):
        parser.error(f"{args.config} gives no run_dir; apply the trainer_run role, which writes it")
    now = time.time()
    if args.command == "add":
        return add(config, args.run, args.priority, args.gpu_memory, args.timeout_s, now, args.planned_memory,
                   args.queued_at)
    if args.command == "admit":
        return admit(config, now)
    if args.command == "list":
        print(json.dumps(listing(config, now), sort_keys=True))
        return 0
    if args.command == "cancel":
        return cancel(config, args.run, now)
    return move(config, args.run, args.priority, args.first)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
