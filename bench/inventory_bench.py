"""How fast the gcp_gpu inventory lists a big fleet, and what it costs in HTTP and token requests.

Run on demand: `python bench/inventory_bench.py [--instances 5000] [--zones 20]`.
It starts the local Compute emulator, seeds N VMs spread over Z zones, and measures:
- `ansible-inventory --list` cold (no cache) and on a cache hit (jsonfile cache), end to end;
- the inventory load alone (Ansible's InventoryManager in this process: the plugin's parse,
  without ansible-inventory's JSON dump of every host), cold and on a cache hit;
- the client's listing alone (GcpClient.aggregated_instances).
Goals (from the issue): one token request per run, ⌈n/500⌉ list requests per project, and the
cached listing under 1 s. Prints one table; nothing here is a test assertion.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
sys.path.insert(0, str(ROOT))

PROJECT = "forja-sandbox"


def seed(emulator, instances: int, zones: int) -> list[str]:
    """Spread the instances evenly over the first `zones` zones of the emulator's catalog."""
    from forja_sandbox.compute_emulator.catalog import ZONES

    chosen = sorted(ZONES)[:zones]
    per_zone = math.ceil(instances / len(chosen))
    left = instances
    for index, zone in enumerate(chosen):
        count = min(per_zone, left)
        if count <= 0:
            break
        emulator.seed_instances(PROJECT, zone, count, f"vm{index}", {"forja": "managed"})
        left -= count
    return chosen


def write_config(path: Path, cache_dir: Path | None) -> Path:
    lines = ["plugin: forja.gpu.gcp_gpu", f"projects: [{PROJECT}]"]
    if cache_dir is not None:
        lines += [
            "cache: true",
            "cache_plugin: ansible.builtin.jsonfile",
            f"cache_connection: {cache_dir}",
            "cache_timeout: 3600",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def cpu_seconds() -> float:
    """User+system CPU of this process (the emulator's thread included) and its finished children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def measure(emulator, action: Callable[[], object]) -> dict[str, float]:
    """Wall and CPU time of `action`, and the requests the emulator saw meanwhile.

    CPU time is reported next to wall time because this machine is shared: the wall time grows
    with the load average, the CPU time much less.
    """
    emulator.stats_reset()
    start, cpu_start = time.perf_counter(), cpu_seconds()
    action()
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    stats = emulator.stats
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": stats["requests"],
        "list_requests": stats["by_method"].get("compute.instances.aggregatedList", 0),
        "token_requests": stats["token_requests"],
    }


def run_cli(config: Path, env: dict[str, str], hosts: int) -> None:
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-inventory"), "-i", str(config), "--list"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or proc.stdout.count('"ansible_host"') != hosts:
        raise SystemExit(f"ansible-inventory failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")


def load_in_process(config: Path, hosts: int) -> None:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    inventory = InventoryManager(loader=DataLoader(), sources=[str(config)])
    found = len(inventory.get_groups_dict().get("forja_gpu", []))
    if found != hosts:
        raise SystemExit(f"the inventory holds {found} managed hosts, expected {hosts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=5000)
    parser.add_argument("--zones", type=int, default=20)
    args = parser.parse_args()

    from ansible.plugins.loader import init_plugin_loader

    # What the ansible CLIs do first (and what loads cache plugins by their FQCN), with forja.gpu
    # found in the clone as ansible.cfg finds it.
    init_plugin_loader([str(ROOT / "collections")])
    from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import GcpClient, GcpConfig

    from forja_sandbox.compute_emulator import ComputeEmulator

    with tempfile.TemporaryDirectory(prefix="forja-inv-bench-") as tmp, ComputeEmulator() as emulator:
        tmpdir = Path(tmp)
        key = emulator.write_service_account_key(tmpdir / "key.json")
        zones = seed(emulator, args.instances, args.zones)
        env = {
            **os.environ,
            "FORJA_GCP_API_URL": emulator.base_url,
            "FORJA_GCP_CREDENTIALS_FILE": str(key),
            "NO_PROXY": "127.0.0.1,localhost",
        }
        os.environ.update(
            {k: env[k] for k in ("FORJA_GCP_API_URL", "FORJA_GCP_CREDENTIALS_FILE", "NO_PROXY")}
        )
        plain = write_config(tmpdir / "plain.gcp_gpu.yml", None)
        cached = write_config(tmpdir / "cached.gcp_gpu.yml", tmpdir / "cache")
        n = args.instances

        def client_listing() -> None:
            client = GcpClient(GcpConfig(project=PROJECT))
            assert len(client.aggregated_instances(PROJECT)) == n

        rows = [
            ("client listing only (GcpClient)", measure(emulator, client_listing)),
            ("ansible-inventory --list, no cache", measure(emulator, lambda: run_cli(plain, env, n))),
            ("ansible-inventory --list, cache miss", measure(emulator, lambda: run_cli(cached, env, n))),
            ("ansible-inventory --list, cache hit", measure(emulator, lambda: run_cli(cached, env, n))),
            ("inventory load in-process, no cache", measure(emulator, lambda: load_in_process(plain, n))),
            ("inventory load in-process, cache hit", measure(emulator, lambda: load_in_process(cached, n))),
        ]

    goal_lists = math.ceil(n / 500)
    print(
        f"\ngcp_gpu inventory: {n} instances in {len(zones)} zones, 1 project "
        f"(goal: 1 token and {goal_lists} list requests per run; cached listing < 1 s)\n"
    )
    header = f"{'case':<40} {'wall s':>8} {'CPU s':>7} {'HTTP req':>9} {'list req':>9} {'token req':>10}"
    print(header)
    print("-" * len(header))
    for name, row in rows:
        print(
            f"{name:<40} {row['wall_s']:>8.2f} {row['cpu_s']:>7.2f} {row['requests']:>9} "
            f"{row['list_requests']:>9} {row['token_requests']:>10}"
        )
    print(f"\nload average: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
