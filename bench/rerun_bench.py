"""What a re-run that changes nothing costs, as a multiple of a play that only connects.

Issue 13's goal: site.yml with changed=0 in at most 10x a bare play (bench/bare_play.yml) on the
same hosts, with the default linear strategy and every check still made. Both are timed in the
same run, alternating, since this machine is noisy; the table shows the median of --repeat runs.

  python bench/rerun_bench.py --hosts 25 26      # test hosts: bench/rerun_play.yml (the host phases)
  python bench/rerun_bench.py --sandbox          # the running sandbox: the whole site.yml

With --hosts the test hosts are booted (Deep Learning VM layer) when they are not up, converged
once with the sandbox's settings (no GPU, nothing installed from NVIDIA's repository) and left up
unless --down is given. With --sandbox the sandbox must have run site.yml already (`make sandbox`).
Extra ansible-playbook arguments go after `--` (e.g. `-- -e ANSIBLE_ROLES_PATH=...`); the
environment is passed through (so ANSIBLE_ROLES_PATH=/elsewhere times another tree's roles).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL = 10.0
BARE = "bench/bare_play.yml"
HOST_PLAY = "bench/rerun_play.yml"


def ansible_playbook(playbook: str, extra: list[str]) -> tuple[float, int, str]:
    """Run one playbook; return its wall time, the recap's total `changed` and its output."""
    start = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), *extra, playbook],
                          cwd=ROOT, capture_output=True, text=True, check=False,
                          env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), **os.environ})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"{playbook} failed (rc {proc.returncode})")
    recap = proc.stdout.rsplit("PLAY RECAP", 1)[-1]
    return wall, sum(int(n) for n in re.findall(r"changed=(\d+)", recap)), proc.stdout


def host_inventory(indices: list[int], folder: Path) -> Path:
    """An inventory of booted test hosts in group forja_gpu, set up as the sandbox sets up its VMs."""
    from forja_sandbox import testhosts  # the sandbox extra: only this mode needs it

    lines = ["[forja_gpu]"]
    for index in indices:
        host = testhosts.up(index, image="dlvm")
        lines.append(f"{host.name} ansible_host={host.address} ansible_user={host.user} "
                     f"ansible_ssh_private_key_file={host.key}")
    ssh_options = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    lines += ["", "[forja_gpu:vars]", f"ansible_ssh_common_args='{ssh_options}'",
              "nvidia_stack_allow_no_gpu=true", "nvidia_stack_install_packages=false",
              f"jupyter_colab_token_fetch_path={folder}/{{{{ inventory_hostname }}}}.jupyter-token"]
    path = folder / "hosts.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", type=int, nargs="+", metavar="N", help="test host indices (thN)")
    where.add_argument("--sandbox", action="store_true", help="the running sandbox and the whole site.yml")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each play (median shown)")
    parser.add_argument("--down", action="store_true", help="remove the test hosts afterwards")
    parser.add_argument("extra", nargs="*", help="arguments for ansible-playbook, after --")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="forja-rerun-bench-") as tmp:
        if args.sandbox:  # the sandbox service (Compute emulator) is started here, never by the inventory
            subprocess.run([sys.executable, "-m", "forja_sandbox.service", "ensure"], cwd=ROOT, check=True)
            playbook, extra = "site.yml", ["-i", "inventory/sandbox", *args.extra]
        else:
            playbook, extra = HOST_PLAY, ["-i", str(host_inventory(args.hosts, Path(tmp))), *args.extra]
        first, first_changed, _ = ansible_playbook(playbook, extra)  # converge (or prove it already is)
        reruns, bares, changed = [], [], []
        for _ in range(args.repeat):
            wall, n, _ = ansible_playbook(playbook, extra)
            reruns.append(wall)
            changed.append(n)
            bares.append(ansible_playbook(BARE, extra)[0])
        if args.down and args.hosts:
            from forja_sandbox import testhosts

            for index in args.hosts:
                testhosts.down(index)
    rerun, bare = statistics.median(reruns), statistics.median(bares)
    where_text = "sandbox" if args.sandbox else " ".join(f"th{i}" for i in args.hosts)
    print(f"{playbook} on {where_text}, linear strategy, median of {args.repeat}")
    print(f"{'play':<36}{'wall s':>9}{'changed':>9}")
    print(f"{'first run (converge)':<36}{first:>9.1f}{first_changed:>9}")
    print(f"{'re-run':<36}{rerun:>9.1f}{max(changed):>9}")
    print(f"{'bare play (connect only)':<36}{bare:>9.1f}{0:>9}")
    print(f"{f're-run / bare play (goal <= {GOAL:g})':<36}{rerun / bare:>9.2f}")
    return 0 if max(changed) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
