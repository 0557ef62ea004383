"""From nothing to Colab-ready *with a PyTorch kernel* on the sandbox, phase by phase.

Run on demand (root, after `make setup`, with the sandbox not in use by anyone else):
`python bench/colab_ready_bench.py [--keep]`. It destroys the sandbox, then times: the image layers
(golden + Deep Learning VM, cached by `make setup`), provision.yml (the emulator, the VM created
from the DLVM image, its host booted, SSH up), gpu.yml (nvidia_stack), jupyter.yml (the server and
the PyTorch kernel environment), and Colab's first cell through an SSH tunnel on the default kernel
(`import torch`, a few training steps). Goal: at most 60 s after setup on the 2-core dev machine.
Prints one table; asserts nothing about time.

`--test-host N` measures the same path without the sandbox (when someone else uses it): test host
thN booted from the Deep Learning VM layer, the jupyter_colab role applied to it (what jupyter.yml
runs), and the first cell; the emulator and provision.yml are then not in the table.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from forja import host_contract
from forja_sandbox import iap, service, testhosts
from forja_sandbox.colab import run_via_direct
from forja_sandbox.tunnel import ssh_tunnel

ROOT = Path(__file__).resolve().parents[1]

GOAL_S = 60.0
VM = "forja-l4"
REMOTE_PORT = int(host_contract.value("jupyter_port"))  # the host contract's port, which site.yml uses
LOCAL_PORT = 18899  # the direct path does not need equal ports; this one collides with no suite
FIRST_CELL = """
import sys, torch
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(512, 8)
y = x.sum(dim=1, keepdim=True)
for _ in range(50):
    opt.zero_grad(); loss = ((model(x) - y) ** 2).mean(); loss.backward(); opt.step()
print(torch.__version__, sys.executable, torch.cuda.device_count(), round(loss.item(), 4))
"""


def play(playbook: str, *extra: str) -> tuple[float, int]:
    """Run one playbook; return its wall time and the total `changed` count of its recap."""
    start = time.perf_counter()
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), *extra, playbook], cwd=ROOT,
                          capture_output=True, text=True, check=False, env=dict(os.environ))
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(f"{playbook} failed (rc {proc.returncode})")
    return wall, sum(int(n) for n in re.findall(r"changed=(\d+)", proc.stdout))


def first_cell(address: str, token_file: Path, proxy_command: str | None = None) -> tuple[float, str]:
    """Open the tunnel and run Colab's first cell on the default kernel; wall time and its output."""
    token = token_file.read_text()
    start = time.perf_counter()
    with ssh_tunnel(address, "ansible", testhosts.key_path(), LOCAL_PORT, REMOTE_PORT,
                    strict_host_key_checking="no", known_hosts_file="/dev/null",
                    proxy_command=proxy_command) as tunnel:
        out = run_via_direct(tunnel.base_url, token, FIRST_CELL, timeout_s=120)
    return time.perf_counter() - start, out.strip()


def on_sandbox() -> list[tuple[str, float, str]]:
    service.destroy()
    service.ensure_running()
    rows: list[tuple[str, float, str]] = []
    start = time.perf_counter()
    testhosts.lowerdirs("dlvm")
    rows.append(("image layers (golden + DLVM, cached)", time.perf_counter() - start, ""))
    for name, playbook in [("provision (VM from the DLVM image, SSH up)", "playbooks/provision.yml"),
                           ("nvidia_stack (no GPU here)", "playbooks/gpu.yml"),
                           ("jupyter_colab (server + PyTorch kernel)", "playbooks/jupyter.yml")]:
        wall, changed = play(playbook, "-i", "inventory/sandbox")
        rows.append((name, wall, f"changed={changed}"))
    (row,) = [r for r in service.describe()["instances"] if str(r["instance"]).endswith(f"/{VM}")]
    zone = str(row["instance"]).split("/", 1)[0]
    wall, out = first_cell(str(row["address"]), Path.home() / ".config/forja/tokens" / f"{VM}.jupyter-token",
                           iap.proxy_command(VM, zone, service.PROJECT))  # the sandbox admits SSH via IAP
    rows.append(("first Colab cell: tunnel, import torch, train", wall, out))
    return rows


def on_test_host(index: int) -> list[tuple[str, float, str]]:
    testhosts.down(index)
    rows: list[tuple[str, float, str]] = []
    start = time.perf_counter()
    host = testhosts.up(index, image="dlvm")
    rows.append((f"th{index} booted from the DLVM layer (cached)", time.perf_counter() - start, ""))
    with tempfile.TemporaryDirectory() as work:
        inventory, token = Path(work) / "inventory.yml", Path(work) / "token"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": {f"th{index}": {
            "ansible_host": host.address, "ansible_user": host.user,
            "ansible_ssh_private_key_file": str(host.key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}}}))
        playbook = Path(work) / "play.yml"
        playbook.write_text(yaml.safe_dump([{"name": "Colab-ready", "hosts": "all", "become": True,
                                             "vars": {"jupyter_colab_token_fetch_path": str(token)},
                                             "roles": ["forja.gpu.jupyter_colab"]}]))
        wall, changed = play(str(playbook), "-i", str(inventory))
        rows.append(("jupyter_colab (server + PyTorch kernel)", wall, f"changed={changed}"))
        wall, out = first_cell(host.address, token)
        rows.append(("first Colab cell: tunnel, import torch, train", wall, out))
    testhosts.down(index)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep the sandbox afterwards")
    parser.add_argument("--test-host", type=int, metavar="N",
                        help="measure on test host thN, not the sandbox")
    args = parser.parse_args()
    rows = on_test_host(args.test_host) if args.test_host else on_sandbox()
    said = rows[-1][2]
    rows[-1] = (rows[-1][0], rows[-1][1], said.split()[0] if said else "")
    total = sum(r[1] for r in rows)
    rows.append((f"= Colab-ready with torch (goal <= {GOAL_S:.0f} s)", total, ""))
    print(f"{'phase':<58}{'wall s':>8}  note")
    for name, seconds, note in rows:
        print(f"{name:<58}{seconds:>8.1f}  {note}")
    print(f"first cell said: {said}")
    if not args.test_host and not args.keep:
        service.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
