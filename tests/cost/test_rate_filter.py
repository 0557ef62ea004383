"""forja_hourly_rate: a host's inventory record priced with forja's table, as Ansible loads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible.plugins.loader import filter_loader

REPO = Path(__file__).resolve().parents[2]

# What the gcp_gpu inventory plugin sets for the README's VM (g2-standard-8 with its L4, us-east1-d).
L4_VM = {
    "inventory_hostname": "forja-l4",
    "instance_name": "forja-l4",
    "machine_type": "g2-standard-8",
    "zone": "us-east1-d",
    "gpu_type": "nvidia-l4",
    "gpu_count": 1,
    "provisioning_model": "STANDARD",
    "preemptible": False,
    "status": "RUNNING",
}


@pytest.fixture(autouse=True)
def _no_user_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORJA_PRICES", raising=False)


@pytest.fixture(scope="module")
def hourly_rate():
    """The filter as a play finds it: by its FQCN in the forja.gpu collection."""
    plugin = filter_loader.get("forja.gpu.forja_hourly_rate")
    assert plugin is not None, "ansible does not find forja.gpu.forja_hourly_rate"
    return plugin.j2_function


def test_an_on_demand_l4_vm_costs_the_tables_g2_standard_8_rate(hourly_rate):
    assert hourly_rate(L4_VM) == pytest.approx(0.8536)


def test_a_spot_l4_vm_costs_the_tables_spot_rate(hourly_rate):
    assert hourly_rate({**L4_VM, "provisioning_model": "SPOT", "preemptible": True}) == pytest.approx(0.56)


def test_the_preemptible_flag_alone_means_spot_and_the_string_false_does_not(hourly_rate):
    no_model = {k: v for k, v in L4_VM.items() if k != "provisioning_model"}
    assert hourly_rate({**no_model, "preemptible": True}) == pytest.approx(0.56)
    assert hourly_rate({**no_model, "preemptible": "false"}) == pytest.approx(0.8536)


def test_the_l4_that_comes_with_a_g2_machine_is_not_added_again(hourly_rate):
    assert hourly_rate({**L4_VM, "gpu_count": 1}) == hourly_rate({**L4_VM, "gpu_type": None, "gpu_count": 0})


def test_an_n1_vm_adds_its_attached_t4s(hourly_rate):
    n1 = {**L4_VM, "machine_type": "n1-standard-8", "gpu_type": "nvidia-tesla-t4", "gpu_count": 2}
    assert hourly_rate(n1) == pytest.approx(0.38 + 2 * 0.35)


def test_a_cluster_member_prices_every_member_only_when_asked(hourly_rate):
    member = {**L4_VM, "machine_type": "g2-standard-24", "gpu_count": 2, "forja_node_count": 3}
    one = hourly_rate(member)
    assert one == hourly_rate({k: v for k, v in member.items() if k != "forja_node_count"})
    assert hourly_rate(member, whole_cluster=True) == pytest.approx(3 * one)
    assert hourly_rate(L4_VM, whole_cluster=True) == pytest.approx(0.8536)  # one VM: no node count
    with pytest.raises(AnsibleFilterError, match="forja-l4 has forja_node_count 'two'"):
        hourly_rate({**L4_VM, "forja_node_count": "two"}, whole_cluster=True)


def test_the_users_price_file_wins_whether_passed_or_in_forja_prices(hourly_rate, tmp_path, monkeypatch):
    own = tmp_path / "mine.yaml"
    own.write_text("machine_types:\n  g2-standard-8:\n    us-east1: {on_demand: 0.70, spot: 0.30}\n")
    assert hourly_rate(L4_VM, prices=str(own)) == pytest.approx(0.70)
    monkeypatch.setenv("FORJA_PRICES", str(own))
    assert hourly_rate({**L4_VM, "provisioning_model": "SPOT"}) == pytest.approx(0.30)


def test_an_unknown_machine_type_fails_naming_it_and_the_entry_to_add(hourly_rate):
    with pytest.raises(AnsibleFilterError) as err:
        hourly_rate({**L4_VM, "machine_type": "z9-mega-8"})
    message = err.value.message  # Ansible's message: ours, then the price table's reason
    assert "forja-l4" in message and "machine_type 'z9-mega-8'" in message
    assert "no price for machine type 'z9-mega-8'" in message
    assert "machine_types.z9-mega-8.us-east1.on_demand" in message
    assert "trainer_run_price_per_hour" in message


def test_a_region_without_prices_fails_naming_the_region(hourly_rate):
    with pytest.raises(AnsibleFilterError) as err:
        hourly_rate({**L4_VM, "zone": "me-west1-a", "provisioning_model": "SPOT"})
    assert "no spot price for 'g2-standard-8' in region 'me-west1'" in err.value.message
    assert "machine_types.g2-standard-8.me-west1.spot" in err.value.message


@pytest.mark.parametrize("missing", ["machine_type", "zone"])
def test_a_record_without_machine_type_or_zone_fails_naming_the_field(hourly_rate, missing):
    with pytest.raises(AnsibleFilterError, match=f"forja-l4 has no '{missing}' in its inventory record"):
        hourly_rate({**L4_VM, missing: ""})


def test_something_other_than_a_record_is_refused(hourly_rate):
    with pytest.raises(AnsibleFilterError, match="expected a host's inventory record"):
        hourly_rate("g2-standard-8")


def test_ansible_doc_renders_the_filter():
    doc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-doc")), "-t", "filter", "forja.gpu.forja_hourly_rate"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "[WARNING]" not in doc.stderr and "[ERROR]" not in doc.stderr, doc.stderr
    for expected in ("machine_type", "provisioning_model", "FORJA_PRICES", "RETURN VALUES", "0.8536"):
        assert expected in doc.stdout, expected
