"""The VM is stated once: the gcp_instance role's defaults are the user's VM, and the site's
group_vars repeat none of them (a repeated default is dead: it hides a change to the role)."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import MACHINE_TYPES
from gcp_helpers import REPO, ROLE_VM_OPTIONS

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


def _module_docs() -> tuple[dict, dict]:
    from ansible_collections.forja.gpu.plugins.modules import gcp_gpu_instance

    return yaml.safe_load(gcp_gpu_instance.DOCUMENTATION)["options"], gcp_gpu_instance.ARGUMENT_SPEC


@pytest.mark.parametrize("option", ROLE_VM_OPTIONS)
def test_the_module_states_no_vm_default_and_the_role_passes_each(option):
    documented, spec = _module_docs()
    assert "default" not in documented[option] and "default" not in spec[option], (
        f"gcp_gpu_instance's {option} has a default: the gcp_instance role's defaults are the one "
        "statement of the VM"
    )
    assert f"gcp_instance_{option}" in ROLE_DEFAULTS
    role_task = yaml.safe_load((REPO / "roles/gcp_instance/tasks/instance.yml").read_text())[0]
    if option == "spot":  # passed as the provisioning model, whose default follows gcp_instance_spot
        assert "gcp_instance_spot" in ROLE_DEFAULTS["gcp_instance_provisioning_model"]
        option = "provisioning_model"
    assert f"gcp_instance_{option}" in str(role_task["forja.gpu.gcp_gpu_instance"][option])


def test_no_module_default_repeats_a_role_default():
    documented, _spec = _module_docs()
    repeated = [
        name
        for name, doc in documented.items()
        if doc.get("default") not in (None, [], {}, "", False)
        and ROLE_DEFAULTS.get(f"gcp_instance_{name}") == doc["default"]
    ]
    assert repeated == []


def test_the_module_documents_exactly_what_it_accepts():
    """ansible-doc shows the DOCUMENTATION; the module enforces ARGUMENT_SPEC: they must agree."""
    documented, spec = _module_docs()
    from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import AUTH_ARGUMENT_SPEC

    own = {k: v for k, v in spec.items() if k not in AUTH_ARGUMENT_SPEC}
    assert set(documented) == set(own)
    for name, entry in own.items():
        for key in ("type", "default", "choices", "elements"):
            assert documented[name].get(key) == entry.get(key), (name, key)
        assert bool(documented[name].get("required")) == bool(entry.get("required")), name
