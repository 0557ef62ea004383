"""Inventory plugin that starts forja's local sandbox cloud on demand."""

from __future__ import annotations

DOCUMENTATION = r"""
name: forja_sandbox
short_description: Start forja's local sandbox cloud so the gcp_gpu inventory can list it
description:
  - The sandbox is forja's embedded default cloud, a local Compute Engine API emulator whose
    instances are real local hosts (systemd-nspawn containers with systemd, sshd, apt and pip).
  - This plugin adds no hosts. It makes sure the sandbox service runs (starting it in the
    background when it does not) so that a C(gcp_gpu) inventory source placed after it in the same
    inventory folder, and the C(gcp_gpu_instance) module, reach it with no step done by hand.
  - Needs root on a Linux controller with systemd-nspawn, debootstrap and nftables (C(make setup)).
options:
  plugin:
    description: Marks this file as the forja_sandbox plugin's.
    required: true
    choices: ['forja_sandbox']
  python:
    description:
      - The Python that runs the sandbox service; it must have the C(forja) package installed.
      - Defaults to the Python running Ansible.
    type: str
  start:
    description: Start the service when it is not running. With C(false) a stopped sandbox is an error.
    type: bool
    default: true
"""

EXAMPLES = r"""
# inventory/sandbox/00-forja_sandbox.yml (sorted before gcp_gpu.yml, so it runs first)
plugin: forja_sandbox

---
# Never start it implicitly: fail when `forja sandbox up` was not run first
plugin: forja_sandbox
start: false
"""

import json
import subprocess
import sys

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin


class InventoryModule(BaseInventoryPlugin):
    NAME = "forja_sandbox"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith(("forja_sandbox.yml", "forja_sandbox.yaml"))

    def parse(self, inventory, loader, path, cache=True):  # type: ignore[no-untyped-def]
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        python = self.get_option("python") or sys.executable
        verb = "ensure" if self.get_option("start") else "check"
        try:
            proc = subprocess.run([python, "-m", "forja_sandbox.service", verb],
                                  capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AnsibleParserError(f"forja_sandbox: could not run the sandbox service with {python}: {exc}",
                                     orig_exc=exc) from exc
        if proc.returncode != 0:
            raise AnsibleParserError(
                f"forja_sandbox: the local sandbox cloud is not available ({path}).\n"
                f"{proc.stderr.strip() or proc.stdout.strip()}\n"
                "Fix: run `make setup` (as root) once, or `forja sandbox up`; to use real GCP, pass "
                "`-i inventory/gcp_gpu.yml`.")
        try:
            endpoint = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise AnsibleParserError(f"forja_sandbox: unexpected answer from the service: {proc.stdout!r}",
                                     orig_exc=exc) from exc
        self.inventory.set_variable("all", "forja_sandbox_endpoint", endpoint)
