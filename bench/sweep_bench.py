"""A sweep's own overhead on the sandbox: from one trial's end to the next trial's first step.

Issue 29's goal: a 20-trial sweep of 1-minute trials, sequential on one VM; the time between one
trial's end and the next trial's start is at most 10 % of the trial time (median), forja's own work
and not training. How the sweep keeps it small: with the VM's run queue, the next trial is asked
(Optuna: constant liar) and sent into the queue while the current one trains, so the VM starts it
the moment the GPU frees, with no playbook in between; without the queue the gap is one poll plus
one `forja train`.

Measured from the trials' own files, fetched after the sweep (one clock, the VM's): a trial's end
is its summary's time (written after its final evaluation and export); the next one's start is its
`start` event (the training loop begins). Pruning is off, so every trial runs its whole length.

  make sandbox                                     # the sandbox, its VM forja-l4 and its bucket
  python bench/sweep_bench.py                      # 20 trials of about a minute, about 25 minutes
  python bench/sweep_bench.py --trials 4 --steps 400   # a quick pass, a few minutes
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.10


def main() -> int:
    from forja import following
    from forja.api import Forja
    from forja.cost.run import RunFiles
    from forja.history import History
    from forja_sandbox import service

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20, help="trials of the sweep (default 20)")
    parser.add_argument("--steps", type=int, default=11000,
                        help="steps of each digits trial: about a minute on the sandbox's VM at 11000 "
                        "(4000 took 22 s there)")
    parser.add_argument("--poll", type=float, default=2.0, help="seconds between the sweep's looks")
    args = parser.parse_args()
    service.ensure_running()
    with tempfile.TemporaryDirectory(prefix="forja-sweep-bench-") as tmp:
        folder = Path(tmp)
        config = yaml.safe_load((ROOT / "trainer/configs/digits.yaml").read_text())
        config.update(steps=args.steps, log_every_steps=max(1, args.steps // 20), render_plots=False)
        (folder / "bench.yaml").write_text(yaml.safe_dump(config))
        forja = Forja(folder, ROOT / "inventory/sandbox", host_key_checking=False, send_project=False,
                      history=History(folder / "history.sqlite"))
        name = f"sweep-bench-{time.strftime('%H%M%S')}"
        began = time.monotonic()
        report = forja.sweep(folder / "bench.yaml", space=ROOT / "examples/sweep/space.yaml",
                             trials=args.trials, name=name, prune=False, poll_s=args.poll)
        wall = time.monotonic() - began
        trials = []
        for row in sorted(report.trials, key=lambda r: r.number):
            fetched = following.fetch_run(forja, row.run).artifact_dir
            files = RunFiles.read(fetched)
            start = next((e["time"] for e in files.events if e.get("event") == "start"), None)
            trials.append((row, start, files.summary.get("time"), files.summary.get("wall_s")))
    print(f"\nsweep {name} on the sandbox: {args.trials} trials of {args.steps} steps, one at a time; "
          f"{wall:.0f} s in all; the next trial waits in the VM run queue")
    print(f"{'trial':>5} {'state':9} {'trial s':>8} {'gap s':>7} {'gap/trial':>9}")
    ratios = []
    for (_, _, end, _), (after, start, _, trial_s) in itertools.pairwise(trials):
        if end is None or start is None or not trial_s:
            print(f"{after.number:5} {after.state:9} {'-':>8} {'-':>7} {'-':>9}  (files missing)")
            continue
        gap = start - end
        ratios.append(gap / trial_s)
        print(f"{after.number:5} {after.state:9} {trial_s:8.1f} {gap:7.1f} {gap / trial_s:9.1%}")
    if not ratios:
        print("no pair of trials to measure")
        return 1
    median = statistics.median(ratios)
    mark = "ok" if median <= GOAL else "MISSED"
    print(f"median gap / trial time: {median:.1%} (goal <= {GOAL:.0%}): {mark}")
    return 0 if median <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
