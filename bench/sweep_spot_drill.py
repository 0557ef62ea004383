"""The sweep's Spot drill on the sandbox: a 10-trial sweep whose VM is preempted twice, the second
time into a stock-out that moves it to another zone.

Issue 29's goal: the study completes with every trial accounted for, and the preempted trials resume
from their own checkpoints (steps lost at most one checkpoint interval). What it does, through the
parts a user has (`Forja.sweep` with fallback zones: a managed watcher per VM) and Google's own
clients for what Google does (forja_sandbox/drill.py's: simulateMaintenanceEvent, the bucket's
listing):
1. a sweep of 10 digits trials starts on the sandbox's Spot VM (forja-l4), one at a time;
2. once trial 3 has a verified checkpoint in the bucket, Google preempts the VM: the sweep's watcher
   starts it again in its zone and the trial resumes from the VM's disk;
3. once trial 6 has one, the zone is made to stock out and Google preempts the VM again: the
   watcher makes the VM again in the next fallback zone and sends the trials again; the trial
   resumes from the bucket;
4. the sweep completes; each trial's summary says its preemptions and the steps a resume redid.

A drill, not a test: it prints a table and exits 1 when a goal is missed. It is too long for CI's
host tier (about 10 minutes); the parts it joins are each tested there (the managed drill of one
run in tests/sandbox/test_site_e2e.py, the sweep's trials on a host in tests/api/test_sweep_hosts.py,
a preempted trial resumed by the local runner in tests/sweep/test_sweep_local.py).

  make sandbox
  python bench/sweep_spot_drill.py                 # 10 trials of 3,000 steps
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BUCKET, PREFIX, HOST = "forja-sandbox-checkpoints", "checkpoints", "forja-l4"


def main() -> int:
    from forja.api import Forja
    from forja.history import History
    from forja_sandbox import hostlayers, service

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10, help="trials of the sweep (default 10)")
    parser.add_argument("--steps", type=int, default=3000, help="digits steps of each trial (default 3000)")
    parser.add_argument("--preempt", type=int, nargs=2, default=(3, 6), metavar=("RESTART", "MOVE"),
                        help="the trials (1-based) preempted: first in place, then into a stock-out")
    args = parser.parse_args()
    service.ensure_running()
    with tempfile.TemporaryDirectory(prefix="forja-sweep-drill-") as tmp:
        folder = Path(tmp)
        config = yaml.safe_load((ROOT / "trainer/configs/digits.yaml").read_text())
        config.update(steps=args.steps, checkpoint_every_s=2, log_every_steps=100, render_plots=False)
        (folder / "drill.yaml").write_text(yaml.safe_dump(config))
        forja = Forja(folder, ROOT / "inventory/sandbox", extravars={"gcp_instance_spot": True},
                      host_key_checking=False, send_project=False, history=History(folder / "history.sqlite"))
        # the sandbox's VM is on-demand; the drill's is made again as Spot, over the site-env layer
        # (its install is not what is measured, as in the managed drill of tests/sandbox)
        forja.down(delete=True)
        service.boot_over({"dlvm": hostlayers.site_env()})
        try:
            return _drill(forja, folder, args, config)
        finally:
            service.boot_over(None)
            service.clear_faults()


def _drill(forja: Any, folder: Path, args: argparse.Namespace, config: dict[str, Any]) -> int:
    from forja_sandbox import drill, service

    forja.up(check=False)
    forja.configure()
    (vm,) = forja.observe().values()
    fallback = [z for z in ("us-east1-b", "us-central1-a", "us-east1-d") if z != vm.zone]
    name = f"spot-drill-{time.strftime('%H%M%S')}"
    swept: dict[str, Any] = {}

    def sweep() -> None:
        try:
            swept["report"] = forja.sweep(folder / "drill.yaml", space=ROOT / "examples/sweep/space.yaml",
                                          trials=args.trials, name=name, prune=False, poll_s=3.0,
                                          fallback_zones=fallback)
        except BaseException as exc:  # raised by the drill's own thread
            swept["error"] = exc

    driver = threading.Thread(target=sweep, daemon=True)
    began = time.monotonic()
    driver.start()
    instances = drill._compute()
    preempted: list[tuple[str, str, str, float]] = []
    try:
        for kind, number in zip(("restart", "move"), args.preempt, strict=True):
            run = f"{name}-t{number - 1:03d}"

            def checkpointed(run: str = run) -> Any:
                return not driver.is_alive() or drill._bucket_markers(BUCKET, f"{PREFIX}/{run}/")

            drill._until(f"a verified checkpoint of {run} in the bucket", checkpointed, 1800)
            if not driver.is_alive():  # the sweep ended before the drill could preempt it
                break
            (host, before), = forja.observe().items()
            if kind == "move":
                service.inject_fault(method="instances.start", error="ZONE_RESOURCE_POOL_EXHAUSTED",
                                     zone=before.zone, times=1)
            started = time.monotonic()
            instances.simulate_maintenance_event(project=service.PROJECT, zone=before.zone, instance=host)
            drill._until("the preemption", lambda: drill._vm_status(instances, HOST) != "RUNNING", 120,
                         every_s=0.5)
            drill._until("the VM back", lambda: drill._vm_status(instances, HOST) == "RUNNING", 900,
                         every_s=2.0)
            after = next(iter(forja.observe().values()))
            preempted.append((run, kind, f"{before.zone} -> {after.zone}", time.monotonic() - started))
            print(f"{kind}: {run} preempted in {before.zone}; VM running again in {after.zone} "
                  f"{time.monotonic() - started:.0f} s later", flush=True)
        driver.join()
    finally:
        service.clear_faults()  # the stock-out's rule, whatever happened
    if "error" in swept:
        raise swept["error"]
    report = swept["report"]
    wall = time.monotonic() - began
    rows = []
    for row in sorted(report.trials, key=lambda r: r.number):
        # what the sweep fetched as each trial ended (the VM of the first trials is gone after the move),
        # and the history's columns, synced from the hosts' states at every look
        summary, _ = forja.read_results(row.run)
        record = forja.history.get(row.run)
        summary = {**summary, "steps": record.steps, "preemptions": record.preemptions,
                   "lost_steps": record.lost_steps}
        rows.append((row, summary))
    print(f"\nsweep {name}: {args.trials} trials of {args.steps} steps on {HOST} (Spot), {wall:.0f} s")
    print(f"{'trial':24} {'state':9} {'steps':>6} {'preempt':>7} {'lost':>5} {'interval':>8}")
    missed = []
    for row, summary in rows:
        lost, times = summary.get("lost_steps") or 0, summary.get("preemptions") or 0
        rate = summary.get("samples_per_s") or 0.0
        per_interval = rate / config["batch_size"] * config["checkpoint_every_s"] + config["log_every_steps"]
        print(f"{row.run:24} {row.state:9} {summary.get('steps', '-')!s:>6} {times:7} {lost:5} "
              f"{per_interval:8.0f}")
        if row.state != "complete" or summary.get("steps") != args.steps:
            missed.append(f"{row.run} ended {row.state} at step {summary.get('steps')}")
        if lost > per_interval:
            missed.append(f"{row.run} lost {lost} steps, over a checkpoint interval ({per_interval:.0f})")
    hit = {run for run, *_ in preempted}
    for run in hit:
        summary = next(s for r, s in rows if r.run == run)
        if not summary.get("preemptions"):
            missed.append(f"{run} was preempted but its summary counts no preemption")
    if len(rows) != args.trials:
        missed.append(f"{len(rows)} trials accounted for, of {args.trials}")
    for run, kind, zones, seconds in preempted:
        print(f"{kind:8} {run}: {zones}, VM running again after {seconds:.0f} s")
    print("every trial accounted for, preempted ones resumed: " + ("ok" if not missed else "MISSED"))
    for line in missed:
        print("  " + line)
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
