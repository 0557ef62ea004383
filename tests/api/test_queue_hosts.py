"""The queue drill on a real test host (th6, the API tests' host): a reboot with 3 runs queued and 1 running.

Rides the session's th6 (tests/api/conftest.py) and its built trainer environment; the reboot is
th6 halted and booted again with its disk (testhosts.stop, then up with the same layers), as a VM
that is stopped and started keeps its boot disk. The runs are the digits demo: one long enough to
outlast the drill (cancelled at the end, which must free its slot), and three as long queued
behind it (cancelled in turn once the first of them has started). None declares its GPU memory,
so each takes the GPU alone: the three wait in order. The third is a run a zone move brought back
(issue 32): the managed watcher's own restore (forja.queue.restore, with forja's real train) sends
its entry as the replaced VM mirrored it, first queued an hour ago there, and its wait goes on
counting here: trainer_run_queue_queued_at through the role to the host's `forja_queue.py add`.
The queue's rules themselves are proven in tests/training/test_queue.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from apihosts import REPO, host_vars, ssh, write_inventory

from forja import queue as run_queue
from forja import snapshot, training
from forja.api import Forja
from forja.history import History
from forja_sandbox import hostlayers, testhosts

pytestmark = [pytest.mark.hosts, pytest.mark.slow, pytest.mark.timeout(900)]
QUEUED = ("q-first", "q-second", "q-third")


def digits(folder: Path, name: str, steps: int) -> Path:
    config = yaml.safe_load((REPO / "trainer/configs/digits.yaml").read_text())
    config.update(steps=steps, log_every_steps=5, checkpoint_every_s=5)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def states(host: testhosts.Host) -> dict[str, str]:
    """Each drill run's unit state, read on the host itself."""
    names = ("q-running", *QUEUED)
    units = " ".join(f"forja-train@{n}.service" for n in names)
    said = ssh(host, f"systemctl is-active {units} || true")
    return dict(zip(names, said.split(), strict=True))


def on(host: testhosts.Host, test: str) -> bool:
    """Whether a shell test holds on the host."""
    return ssh(host, f"{test} && echo yes || true").strip() == "yes"


def until(check: Callable[[], bool], what: str, deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, what
        time.sleep(1)


def test_a_reboot_keeps_the_running_run_and_the_queued_ones_in_order(
    th6: testhosts.Host, tmp_path: Path,
) -> None:
    inventory = write_inventory(tmp_path / "inventory.yml", {"th6": host_vars(th6)})
    forja = Forja(inventory=inventory, private_data_dir=tmp_path / "runner", host_key_checking=False,
                  history=History(tmp_path / "history.sqlite"))
    running = forja.train(digits(tmp_path, "q-running", 10**6), name="q-running", queue=True, wait=False)
    assert running.status == "queued"
    # The queue starts it at once (nothing holds the GPU) and it trains.
    until(lambda: on(th6, "sudo test -s /var/lib/forja/runs/q-running/metrics.jsonl"),
          "the queue did not start q-running")
    for name in QUEUED[:2]:
        sent = forja.train(digits(tmp_path, name, 10**6), name=name, queue=True, wait=False)
        assert sent.status == "queued"
    moved = digits(tmp_path, "q-third", 10**6)  # its first send, on the VM the move replaced, left these
    forja.history.start("q-third", name="q-third", config_path=str(moved))
    snapshot.record(forja, "q-third", project=None, config=moved, options={
        "script": None, "args": [], "excludes": [], "procs": None, "hooks": {}, "extravars": {}})
    mirrored = {"run": "q-third", "seq": 7, "priority": 0, "gpu_memory_mib": None, "memory_source": None,
                "timeout_s": 600, "enqueued_at": time.time() - 3600, "passed": 0, "admitted_at": None}
    said: list[str] = []
    assert run_queue.restore(forja, [mirrored], training.train, say=said.append) == ["q-third"], said
    restored = [e.data["was"] for e in forja.history.events("q-third") if e.kind == "queue_restored"]
    assert restored == ["queued"], restored
    before = forja.queue()
    assert [(r.run, r.state) for r in before] == [("q-running", "running"), ("q-first", "queued"),
                                                   ("q-second", "queued"), ("q-third", "queued")]
    waited = {r.run: r.waited_s or 0 for r in before}
    assert waited["q-third"] >= 3600 > waited["q-first"], before  # its wait kept over the move

    testhosts.stop(th6.index)  # the reboot: the guest shuts down (the run checkpoints), the disk stays
    testhosts.up(th6.index, image="dlvm", over=hostlayers.trainer_env())
    booted = float(ssh(th6, "date +%s"))
    until(lambda: states(th6)["q-running"] == "active", f"q-running did not resume: {states(th6)}")
    # forja-queue.timer's first pass after boot has looked at the queue (and started nothing).
    status = "/var/lib/forja/runs/.queue/status.json"
    until(lambda: float(ssh(th6, f"sudo stat -c %Y {status} || echo 0")) >= booted,
          "the queue was not looked at after the boot")
    after = forja.queue()
    assert [(r.run, r.state, r.position) for r in after] == [
        ("q-running", "running", 0), ("q-first", "queued", 1), ("q-second", "queued", 2),
        ("q-third", "queued", 3)], after
    assert all(r.waited_s is not None and r.waited_s > 0 for r in after[1:]), after
    events = "/var/lib/forja/runs/q-running/events.jsonl"
    resumed = ssh(th6, f"sudo grep -c '\"event\":\"resume\"' {events} || true")
    assert int(resumed.strip() or 0) >= 1, "q-running started afresh instead of resuming"

    # Cancel kills the running one (all its processes) and frees its slot: the next in line starts.
    forja.queue_cancel("q-running")
    assert states(th6)["q-running"] in ("inactive", "failed")
    assert ssh(th6, "pgrep -u forja-train -f 'q-running' || true").strip() == ""
    until(lambda: states(th6)["q-first"] in ("active", "inactive")
          and on(th6, "sudo test -e /var/lib/forja/runs/q-first/queue.json"),
        f"q-first did not start after the cancel: {states(th6)}")
    cancelled = forja.history.get("q-running")
    assert (cancelled.status, cancelled.message) == ("stopped", "cancelled (forja queue cancel)")
    # The drill's point is made: the rest are cancelled (waiting ones leave the queue; their draining
    # one after the other is tests/training/test_queue.py's), so th6 is free for the next API test.
    for name in reversed(QUEUED):
        forja.queue_cancel(name)
    assert [r.run for r in forja.queue() if r.state in ("queued", "running")] == []
