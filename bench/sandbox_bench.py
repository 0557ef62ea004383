"""How long the whole job takes on the sandbox, phase by phase, and what an idempotent re-run costs.

Run on demand (root, after `make setup`): `python bench/sandbox_bench.py [--keep]`.
It starts from nothing (the sandbox destroyed), runs the phases of site.yml one playbook at a time,
then site.yml again (which must change nothing) with Ansible's linear strategy and with the opt-in
mitogen_linear one, the floor play (provisioning plus one remote call per role: the least a re-run
could do) and a bare play that only connects to the same hosts, and prints one table. The goal for
the re-run is at most 10x the bare play (issue 13); all are timed in the same run, since this machine
is noisy. `python bench/rerun_bench.py --sandbox` times only the re-run and the bare play, repeatedly.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from rerun_bench import GOAL  # the same goal as the re-run benchmark (bench/ is the script's folder)

ROOT = Path(__file__).resolve().parents[1]
PHASES = [
    ("provision (VM created, SSH up)", "playbooks/provision.yml"),
    ("nvidia_stack", "playbooks/gpu.yml"),
    ("jupyter_colab (Colab-ready)", "playbooks/jupyter.yml"),
    ("trainer_run (demo trained, fetched)", "playbooks/train.yml"),
    ("autostop", "playbooks/autostop.yml"),
]


MITOGEN = {"ANSIBLE_STRATEGY": "forja.gpu.mitogen_linear"}


def play(playbook: str, env: dict[str, str] | None = None) -> tuple[float, int]:
    """Run one playbook; return its wall time and the total `changed` count of its recap."""
    start = time.perf_counter()
    argv = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", "inventory/sandbox", playbook]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"{playbook} failed (rc {proc.returncode})")
    changed = sum(int(n) for n in re.findall(r"changed=(\d+)", proc.stdout))
    return wall, changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the sandbox afterwards")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "forja_sandbox.service", "destroy"], cwd=ROOT, check=True)
    subprocess.run([sys.executable, "-m", "forja_sandbox.service", "ensure"], cwd=ROOT, check=True)
    rows: list[tuple[str, float, int]] = []
    total = 0.0
    for name, playbook in PHASES:
        wall, changed = play(playbook)
        total += wall
        rows.append((name, wall, changed))
        if "Colab-ready" in name:
            rows.append(("= from nothing to Colab-ready Jupyter", total, -1))
        if "trained" in name:
            rows.append(("= from nothing to trained demo", total, -1))
    rerun, rerun_changed = play("site.yml")
    fast, fast_changed = play("site.yml", MITOGEN)
    floor, _ = play("bench/floor_play.yml")
    floor_mitogen, _ = play("bench/floor_play.yml", MITOGEN)
    bare, _ = play("bench/bare_play.yml")
    bare_mitogen, _ = play("bench/bare_play.yml", MITOGEN)
    rows += [("site.yml again (idempotent)", rerun, rerun_changed),
             ("site.yml again, mitogen_linear", fast, fast_changed),
             ("floor: provision + 1 call per role", floor, 0),
             ("floor, mitogen_linear", floor_mitogen, 0),
             ("bare play (connect only)", bare, 0),
             ("bare play, mitogen_linear", bare_mitogen, 0)]
    print(f"{'phase':<42}{'wall s':>9}{'changed':>9}")
    for name, wall, changed in rows:
        print(f"{name:<42}{wall:>9.1f}{'' if changed < 0 else changed:>9}")
    ratios = [(f"re-run / bare play (goal <= {GOAL:g})", rerun / bare),
              ("mitogen re-run / bare play", fast / bare),
              ("floor / bare play", floor / bare),
              ("mitogen re-run / mitogen bare play", fast / bare_mitogen),
              ("mitogen floor / mitogen bare play", floor_mitogen / bare_mitogen)]
    for name, ratio in ratios:
        print(f"{name:<42}{ratio:>9.2f}")
    if not args.keep:
        subprocess.run([sys.executable, "-m", "forja_sandbox.service", "destroy"], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
