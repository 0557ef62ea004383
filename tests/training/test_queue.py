"""The run queue on a VM (roles/trainer_run/files/forja_queue.py), its readers and forja's checks.

The admission decision is a pure function, specified here by table: order, memory admission, no
head-of-line blocking without starvation, timeouts and runs that can never fit. The host side runs
as it does on a VM, as separate processes over a queue folder (a reboot is a new process reading
the same files), with a stand-in for systemctl on PATH that keeps the units' states in a file: it
proves what the script asks systemd, not systemd itself (the queue drill in
tests/api/test_train_hosts.py does, on a real host). Then the readers: forja-train-state's "queued"
status and the autostop agent's busy/idle; and forja's refusals before anything is sent.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from forja import errors
from forja import queue as run_queue

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "roles" / "trainer_run" / "files"
PROGRAM = FILES / "forja_queue.py"
L4 = 23034  # MiB, what nvidia-smi reports for the L4 (and the sandbox's trainer_run_gpu_capacity_mib)
GIB = 1024


def _load(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


q = run_queue.rules()  # the host's program, as forja loads it


def entry(run: str, seq: int, mem: int | None = None, *, priority: int = 0, age: float = 0, passed: int = 0,
          timeout: int = 600) -> dict[str, Any]:
    return {"run": run, "seq": seq, "priority": priority, "gpu_memory_mib": mem, "timeout_s": timeout,
            "enqueued_at": 1000.0 - age, "passed": passed, "admitted_at": None}


# --- the decision -------------------------------------------------------------------------------


def test_higher_priority_goes_first_then_first_come_first_served() -> None:
    queue = [entry("a", 1), entry("b", 2, priority=5), entry("c", 3), entry("d", 4, priority=5)]
    assert [e["run"] for e in q.ordered(queue)] == ["b", "d", "a", "c"]
    # Nothing known about their memory: the first in order takes the GPU alone, the rest wait.
    decision = q.decide(queue, {}, L4, 1000.0)
    assert decision["admit"] == ["b"]
    assert [w["run"] for w in decision["waiting"]] == ["d", "a", "c"]
    assert "takes the GPU alone, after b" in decision["waiting"][0]["reason"]


def test_runs_that_fit_share_the_gpu_and_one_that_does_not_waits_saying_why() -> None:
    queue = [entry("small-1", 1, 10 * GIB), entry("small-2", 2, 10 * GIB), entry("small-3", 3, 10 * GIB)]
    decision = q.decide(queue, {}, L4, 1000.0)
    assert decision["admit"] == ["small-1", "small-2"]
    assert decision["waiting"] == [{"run": "small-3", "runnable": True,
                                    "reason": "needs 10.0 GiB, 2.5 GiB free beside small-1, small-2"}]
    # Beside a run whose memory is unknown (one started without the queue, or without an estimate),
    # nothing starts, and an unknown GPU runs one at a time.
    assert q.decide(queue, {"manual": None}, L4, 1000.0)["admit"] == []
    assert q.decide(queue, {}, None, 1000.0)["admit"] == ["small-1"]


def test_a_run_that_fits_passes_one_that_does_not_until_that_one_was_passed_enough() -> None:
    queue = [entry("big", 1, 20 * GIB), entry("small", 2, 2 * GIB)]
    holders = {"running": 8 * GIB}
    decision = q.decide(queue, holders, L4, 1000.0)
    assert decision["admit"] == ["small"]  # no head-of-line blocking
    assert decision["passed"] == {"big": 1}
    # Passed MAX_PASSES times: nothing behind it starts any more, whatever fits.
    queue[0]["passed"] = q.MAX_PASSES
    decision = q.decide(queue, holders, L4, 1000.0)
    assert decision["admit"] == []
    assert decision["waiting"][1]["reason"].startswith("waits for big to start first")
    # So does waiting AGING_S.
    aged = [entry("big", 1, 20 * GIB, age=q.AGING_S), entry("small", 2, 2 * GIB)]
    assert q.decide(aged, holders, L4, 1000.0)["admit"] == []


def test_a_run_that_can_never_fit_or_waited_past_its_timeout_fails_with_the_reason() -> None:
    queue = [entry("huge", 1, 30 * GIB), entry("late", 2, 20 * GIB, age=601),
             entry("patient", 3, 20 * GIB, age=60), entry("no-limit", 4, 20 * GIB, age=10**5, timeout=0)]
    decision = q.decide(queue, {"running": 8 * GIB}, L4, 1000.0)
    assert decision["fail"] == {
        "huge": "needs 30.0 GiB, the GPU has 22.5 GiB",
        "late": "waited 10 min (its queue timeout): needs 20.0 GiB, 14.5 GiB free beside running",
    }
    assert [w["run"] for w in decision["waiting"]] == ["patient", "no-limit"]


def test_a_run_queued_again_after_a_zone_move_keeps_its_wait_and_its_timeout_starts_on_the_new_host(
    host: dict[str, Any],
) -> None:
    set_up(host, "moved")
    first = time.time() - 500  # queued 500 s ago on the VM the move replaced
    assert queue_cli(host, "add", "moved", "--gpu-memory", "20GiB", "--queued-at", str(first)).returncode == 0
    row = json.loads(queue_cli(host, "list").stdout)["entries"][0]
    assert row["enqueued_at"] == first and row["waited_s"] >= 500
    # Behind a 8 GiB run it waits: 700 s after it was first queued, but 200 s on this host (timeout 600).
    requeued = {**entry("moved", 1, 20 * GIB, age=700), "requeued_at": 800.0}
    decision = q.decide([requeued], {"running": 8 * GIB}, L4, 1000.0)
    assert decision["fail"] == {} and decision["waiting"][0]["run"] == "moved"
    late = q.decide([{**requeued, "requeued_at": 400.0}], {"running": 8 * GIB}, L4, 1000.0)["fail"]
    assert late["moved"].startswith("waited 12 min (its queue timeout)")


@pytest.mark.parametrize(("text", "mib"), [("10GiB", 10240), ("10 GB", 9537), ("900MiB", 900), ("900", 900),
                                           ("1.5gib", 1536)])
def test_gpu_memory_reads_as_mib(text: str, mib: int) -> None:
    assert q.parse_memory(text) == mib


# --- on the host: files and systemd --------------------------------------------------------------

FAKE_SYSTEMCTL = """\
#!{python}
# A stand-in for systemctl: the units' states in $FAKE_UNITS (JSON), every call logged to $FAKE_LOG.
import json, os, sys
path, log = os.environ["FAKE_UNITS"], os.environ["FAKE_LOG"]
units = json.load(open(path)) if os.path.exists(path) else {{}}
args = [a for a in sys.argv[1:] if a not in ("--no-block",) and not a.startswith("--kill-whom")
        and not a.startswith("--signal")]
open(log, "a").write(" ".join(args) + "\\n")
verb, names = args[0], args[1:]
unit = lambda n: units.setdefault(n, {{"ActiveState": "inactive", "UnitFileState": "disabled"}})
if verb == "show":
    names = [n for n in names if n not in ("-p",) and not n.startswith("Id,")]
    for n in names:
        print("Id=" + n, "ActiveState=" + unit(n)["ActiveState"], "UnitFileState=" + unit(n)["UnitFileState"],
              "", sep="\\n")
elif verb == "is-system-running":
    print("running")
elif verb == "enable":
    unit(names[0])["UnitFileState"] = "enabled"
elif verb == "disable":
    unit(names[0])["UnitFileState"] = "disabled"
elif verb == "start" and names[0].startswith("forja-train@"):
    unit(names[0])["ActiveState"] = "active"
elif verb == "stop":
    unit(names[0])["ActiveState"] = "inactive"
json.dump(units, open(path, "w"))
"""


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Any]:
    """A host's folders (run_dir, /etc/forja/train), the queue's config and a systemctl stand-in."""
    runs, conf, bin_dir = tmp_path / "runs", tmp_path / "train", tmp_path / "bin"
    for folder in (runs, conf, bin_dir):
        folder.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL.format(python=sys.executable))
    fake.chmod(0o755)
    config = tmp_path / "queue.json"
    config.write_text(json.dumps({"run_dir": str(runs), "conf_dir": str(conf), "gpu_memory_mib": L4,
                                  "nvidia_smi": str(tmp_path / "no-nvidia-smi")}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "FAKE_UNITS": str(tmp_path / "units.json"), "FAKE_LOG": str(tmp_path / "systemctl.log")}
    return {"runs": runs, "conf": conf, "config": config, "env": env, "log": tmp_path / "systemctl.log",
            "units": tmp_path / "units.json"}


def queue_cli(host: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PROGRAM), "--config", str(host["config"]), *args],
                          capture_output=True, text=True, env=host["env"], check=False, timeout=60)


def set_up(host: dict[str, Any], run: str, spec: str = "steps: 10\n") -> None:
    """What the role writes for every run, queued or not: its env file, its spec and its folder."""
    (host["conf"] / f"{run}.env").write_text(f"FORJA_RUN={run}\nFORJA_OUT={host['runs'] / run}\n")
    (host["conf"] / f"{run}.yaml").write_text(spec)
    (host["runs"] / run).mkdir()


def test_queued_runs_start_in_order_as_they_fit_and_keep_their_place_across_processes(
    host: dict[str, Any],
) -> None:
    set_up(host, "first", "command: [train.py]\ngpu_memory: 12GiB\n")
    for run in ("second", "third"):
        set_up(host, run)
    # An earlier run of the same spec as "third" peaked at 4 GB: its estimate (plus the CUDA context).
    set_up(host, "earlier")
    (host["runs"] / "earlier" / "metrics.jsonl").write_text('{"step": 1, "gpu_mem_gb": 4.0}\n')
    assert queue_cli(host, "add", "first", "--planned-memory", "1GiB").returncode == 0  # the spec's word wins
    assert queue_cli(host, "add", "second", "--gpu-memory", "12GiB", "--priority", "-1").returncode == 0
    assert queue_cli(host, "add", "third").returncode == 0
    added = json.loads(queue_cli(host, "add", "third").stdout)
    assert added["queued"] is False  # already there: it keeps its place

    assert queue_cli(host, "admit").returncode == 0
    log = host["log"].read_text()
    assert "enable forja-train@first.service" in log and "start forja-train@first.service" in log
    assert "start forja-train@third.service" in log  # 3815 + 512 MiB fit beside first's 12 GiB
    assert "forja-train@second.service" not in log.replace("show", "")  # 12 GiB do not fit beside
    admitted = json.loads((host["runs"] / "first" / q.RUN_FILE).read_text())
    assert admitted["outcome"] == "admitted" and admitted["waited_s"] >= 0

    # A new process (as after a reboot) reads the same order from the folder.
    listing = json.loads(queue_cli(host, "list").stdout)
    rows = {r["run"]: r for r in listing["entries"]}
    assert (rows["first"]["state"], rows["third"]["state"], rows["second"]["state"]) == ("running", "running",
                                                                                          "queued")
    assert rows["first"]["memory_source"] == "run spec"
    assert rows["third"]["gpu_memory_mib"] == int(4e9 / 2**20) + q.CONTEXT_MIB
    assert rows["second"]["reason"].startswith("needs 12.0 GiB")
    status = json.loads((host["runs"] / q.QUEUE_DIR_NAME / q.STATUS_FILE).read_text())
    assert [w["run"] for w in status["waiting"]] == ["second"]

    # first ends: its slot frees at the next pass and second starts.
    units = json.loads(host["units"].read_text())
    units["forja-train@first.service"]["ActiveState"] = "inactive"
    host["units"].write_text(json.dumps(units))
    (host["runs"] / "first" / "COMPLETED").touch()
    queue_cli(host, "admit")
    assert "start forja-train@second.service" in host["log"].read_text()

    # Cancel: a running one is killed and disabled; a run no queue holds is said to be so.
    said = queue_cli(host, "cancel", "third")
    assert json.loads(said.stdout)["cancelled"] == "running"
    assert "kill forja-train@third.service" in host["log"].read_text()
    assert "disable forja-train@third.service" in host["log"].read_text()
    assert queue_cli(host, "cancel", "nobody").returncode == 3


def test_the_state_reader_says_queued_and_the_autostop_agent_counts_a_runnable_queue_as_busy(
    host: dict[str, Any],
) -> None:
    set_up(host, "waiting")
    queue_cli(host, "add", "waiting", "--gpu-memory", "20GiB")
    set_up(host, "holder")
    units = {"forja-train@holder.service": {"ActiveState": "active", "UnitFileState": "enabled"}}
    host["units"].write_text(json.dumps(units))
    queue_cli(host, "admit")

    reader = _load("forja_train_state_queue", FILES / "forja-train-state")
    reader.forja_queue.CONFIG = str(host["config"])
    kind, info = reader.queue_state("waiting", str(host["runs"] / "waiting"))
    assert kind == "queued" and info["position"] == 1 and "takes the GPU alone" not in info["reason"]
    assert "holder, whose GPU memory is unknown" in info["reason"]
    # `forja status` shows the time waited (TrainStatus), from the state the host reports.
    from forja.runs import TrainStatus
    from forja.runstate import RunState

    waited = TrainStatus.from_state("box", RunState(run="waiting", status=kind, queue=info)).waited_s
    assert waited is not None and waited == info["waited_s"]

    agent = _load("forja_autostop_queue", REPO / "roles" / "autostop" / "files" / "forja_autostop.py")
    assert (agent.QUEUE_DIR, agent.QUEUE_STATUS) == (q.QUEUE_DIR_NAME, q.STATUS_FILE)
    status = json.loads((host["runs"] / q.QUEUE_DIR_NAME / q.STATUS_FILE).read_text())
    busy, notes = agent.queue_signals(str(host["runs"]), status["updated_at"] + 1)
    assert busy == [f"queued run waiting: {info['reason']}"] and notes == []
    # A queue stuck on what can never run keeps nothing up, nor does one nobody looks at any more.
    (host["runs"] / q.QUEUE_DIR_NAME / q.STATUS_FILE).write_text(json.dumps(
        {"updated_at": 0, "waiting": [], "failed": {"huge": "needs 30.0 GiB, the GPU has 22.5 GiB"}}))
    assert agent.queue_signals(str(host["runs"]), 10.0) == (
        [], ["queued run huge can never start: needs 30.0 GiB, the GPU has 22.5 GiB"])
    busy, notes = agent.queue_signals(str(host["runs"] / ".."), 0)  # no queue here: nothing said
    assert (busy, notes) == ([], [])
    stale = {"updated_at": 0, "waiting": status["waiting"], "failed": {}}
    (host["runs"] / q.QUEUE_DIR_NAME / q.STATUS_FILE).write_text(json.dumps(stale))
    busy, notes = agent.queue_signals(str(host["runs"]), agent.QUEUE_STALE_S + 1)
    assert busy == [] and "not looked at" in notes[0]

    set_up(host, "planned", "steps: 77\n")  # nothing declared, no earlier run: the trainer's plan counts
    queue_cli(host, "add", "planned", "--planned-memory", "3GiB")
    rows = {r["run"]: r for r in json.loads(queue_cli(host, "list").stdout)["entries"]}
    assert (rows["planned"]["gpu_memory_mib"], rows["planned"]["memory_source"]) == (3 * GIB, "planned")


# --- forja's checks, before anything is sent ----------------------------------------------------


def test_a_priority_that_is_not_an_integer_is_refused_naming_the_fix() -> None:
    assert run_queue.priority_of("-3") == -3
    with pytest.raises(errors.ConfigError, match=r"'high' is not an integer; give a whole number"):
        run_queue.priority_of("high")
    with pytest.raises(errors.ConfigError, match=r"is not an amount of GPU memory; give e\.g\. 10GiB"):
        run_queue.memory_mib("lots")


def test_declared_gpu_memory_beyond_the_inventory_gpu_is_refused_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    from forja.api import Forja
    from forja.history import History

    inventory = tmp_path / "hosts.yml"
    inventory.write_text(textwrap.dedent(f"""\
        forja_gpu:
          hosts:
            box:
              ansible_host: 127.0.0.1
              trainer_run_gpu_capacity_mib: {L4}
        """))
    forja = Forja(inventory=str(inventory), history=History(tmp_path / "history.sqlite"))
    with pytest.raises(errors.ConfigError, match=r"declares 30\.0 GiB .* box's GPU has 22\.5 GiB: it could"):
        forja.train(REPO / "trainer" / "configs" / "digits.yaml", queue=True, gpu_memory="30GiB", wait=False)
    with pytest.raises(errors.ConfigError, match="only for a queued run, ignored otherwise; add --queue"):
        forja.train(REPO / "trainer" / "configs" / "digits.yaml", priority=3, wait=False)
    assert forja.history.list() == []  # nothing recorded, nothing sent


def test_a_queued_run_without_a_declared_peak_sends_the_trainers_kept_plan_as_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from forja.plan import plan_file
    from forja.session import Session

    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(textwrap.dedent("""\
        forja_gpu:
          hosts:
            box: {ansible_host: 127.0.0.1, machine_type: g2-standard-8}
        """))
    session = Session(tmp_path, inventory=str(inventory))
    config = REPO / "trainer" / "configs" / "digits.yaml"
    assert run_queue.plan(session, config=config) == {"trainer_run_queue": True}  # no plan kept: unknown
    kept = plan_file(config, "g2-standard-8", 1)  # what `forja plan` (or the estimate) keeps
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps({"peak_mib": {"value": 7000.2, "unit": "MiB", "how": "traced"}}))
    assert run_queue.plan(session, config=config)["trainer_run_gpu_memory_planned"] == "7001MiB"
