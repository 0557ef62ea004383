"""The VM is stated once: the gcp_instance role's defaults are the user's VM, and the site's
group_vars repeat none of them (a repeated default is dead: it hides a change to the role)."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import MACHINE_TYPES
from gcp_helpers import REPO

ROLE_DEFAULTS = yaml.safe_load((REPO / "roles/gcp_instance/defaults/main.yml").read_text())
SITE_VARS = sorted((REPO / "inventory/group_vars").glob("*/*.yml"))

#: The user's VM, as the issue that started forja describes it.
USERS_VM = {
    "gcp_instance_machine_type": "g2-standard-8",
    "gcp_instance_zone": "us-east1-d",
    "gcp_instance_image_family": "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
    "gcp_instance_image_project": "deeplearning-platform-release",
    "gcp_instance_boot_disk_size_gb": 300,
    "gcp_instance_boot_disk_type": "pd-balanced",
    "gcp_instance_boot_disk_interface": "NVME",
    "gcp_instance_spot": False,
}


@pytest.mark.parametrize(("name", "value"), sorted(USERS_VM.items()))
def test_the_role_defaults_are_the_users_vm(name, value):
    assert ROLE_DEFAULTS[name] == value


def test_the_default_machine_type_carries_one_l4_by_the_catalog():
    machine = MACHINE_TYPES[ROLE_DEFAULTS["gcp_instance_machine_type"]]
    carries = (machine.gpu_type, machine.gpu_count, machine.vcpus, machine.memory_mb)
    assert carries == ("nvidia-l4", 1, 8, 32768)


def _site_gcp_vars() -> list[tuple[str, str, object]]:
    found = []
    for path in SITE_VARS:
        for name, value in (yaml.safe_load(path.read_text()) or {}).items():
            if name.startswith("gcp_instance_"):
                found.append((path.relative_to(REPO).as_posix(), name, value))
    return found


def test_the_site_group_vars_are_read():
    """The check below looks at real files (it would pass vacuously on none)."""
    assert SITE_VARS and _site_gcp_vars()


@pytest.mark.parametrize(("path", "name", "value"), _site_gcp_vars())
def test_the_site_group_vars_set_only_what_differs_from_the_role(path, name, value):
    assert name in ROLE_DEFAULTS, f"{path}: {name} is no variable of the gcp_instance role (a typo?)"
    assert value != ROLE_DEFAULTS[name], (
        f"{path}: {name}={value!r} repeats the gcp_instance role's default; remove it from {path} "
        "(the role's defaults are the one statement of the VM)"
    )
