"""The gcp_gpu inventory plugin through ansible-inventory against the emulator."""

from __future__ import annotations

import math
import re
import shutil

import pytest
import yaml
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import GcpClient, GcpConfig
from gcp_helpers import REPO, emulator_env, inventory_json, run_inventory, run_playbook

PROJECT = "forja-sandbox"
SECRET = "ansible:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKeepThisOutOfTheInventory"


def write_config(path, **options):
    path.write_text(yaml.safe_dump({"plugin": "forja.gpu.gcp_gpu", "projects": [PROJECT], **options}))
    return path


@pytest.fixture
def fleet(emulator, key_file):
    """Two managed L4 VMs (one stopped), one unmanaged e2 VM, and one managed VM with secret metadata."""
    managed = {"forja": "managed"}
    emulator.seed_instances(PROJECT, "us-east1-d", 1, "l4-run", managed, machine_type="g2-standard-8")
    emulator.seed_instances(PROJECT, "us-east1-d", 1, "l4-stop", managed, "TERMINATED", "g2-standard-8")
    emulator.seed_instances(PROJECT, "us-east1-b", 1, "plain", {"team": "web"})
    client = GcpClient(
        GcpConfig(project=PROJECT, api_url=emulator.base_url, credentials_file=str(key_file), env={})
    )
    op = client.request(
        "POST",
        f"projects/{PROJECT}/zones/us-central1-a/instances",
        body={
            "name": "t4-box",
            "machineType": "zones/us-central1-a/machineTypes/n1-standard-8",
            "guestAccelerators": [
                {
                    "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
                    "acceleratorCount": 2,
                }
            ],
            "scheduling": {"onHostMaintenance": "TERMINATE", "provisioningModel": "SPOT"},
            "disks": [
                {
                    "boot": True,
                    "initializeParams": {
                        "sourceImage": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
                    },
                }
            ],
            "networkInterfaces": [{}],
            "labels": managed,
            "metadata": {"items": [{"key": "ssh-keys", "value": SECRET}]},
        },
    )
    client.wait_operation(op, project=PROJECT, timeout_s=30)
    emulator.stats_reset()
    return emulator


def test_hosts_groups_and_hostvars(fleet, key_file, tmp_path):
    source = write_config(
        tmp_path / "fleet.gcp_gpu.yml",
        keyed_groups=[{"key": "zone", "prefix": "zone"}],
        compose={"hourly": "'spot' if preemptible else 'standard'"},
    )
    proc = run_inventory(emulator_env(fleet, key_file), source)
    assert proc.returncode == 0, proc.stderr
    inventory = inventory_json(proc)
    hostvars = inventory["_meta"]["hostvars"]
    assert set(hostvars) == {"l4-run-0", "l4-stop-0", "plain-0", "t4-box"}
    assert sorted(inventory["forja_gpu"]["hosts"]) == ["l4-run-0", "l4-stop-0", "t4-box"]
    assert sorted(inventory["gpu_nvidia_l4"]["hosts"]) == ["l4-run-0", "l4-stop-0"]
    assert inventory["gpu_nvidia_tesla_t4"]["hosts"] == ["t4-box"]
    assert inventory["gpu_none"]["hosts"] == ["plain-0"]
    assert inventory["status_terminated"]["hosts"] == ["l4-stop-0"]
    assert sorted(inventory["zone_us_east1_d"]["hosts"]) == ["l4-run-0", "l4-stop-0"]
    running = hostvars["l4-run-0"]
    assert running["ansible_host"] == running["public_ip"] and running["private_ip"]
    assert (running["zone"], running["machine_type"], running["gpu_type"], running["gpu_count"]) == (
        "us-east1-d",
        "g2-standard-8",
        "nvidia-l4",
        1,
    )
    assert running["status"] == "RUNNING" and running["provisioning_model"] == "STANDARD"
    stopped = hostvars["l4-stop-0"]
    assert stopped["public_ip"] is None and stopped["ansible_host"] == stopped["private_ip"]
    t4 = hostvars["t4-box"]
    assert (t4["gpu_type"], t4["gpu_count"], t4["provisioning_model"], t4["hourly"]) == (
        "nvidia-tesla-t4",
        2,
        "SPOT",
        "spot",
    )
    assert t4["metadata_keys"] == ["ssh-keys"] and "metadata" not in t4
    assert "KeepThisOutOfTheInventory" not in proc.stdout
    assert fleet.stats["token_requests"] == 1
    assert fleet.stats["by_method"] == {"compute.instances.aggregatedList": 1}


def test_one_zone_is_listed_on_the_server_and_labels_filter_there(fleet, key_file, tmp_path):
    source = write_config(
        tmp_path / "zone.gcp_gpu.yml",
        zones=["us-east1-d"],
        labels={"forja": "managed"},
        filters=["status = RUNNING"],
    )
    proc = run_inventory(emulator_env(fleet, key_file), source)
    assert proc.returncode == 0, proc.stderr
    assert set(inventory_json(proc)["_meta"]["hostvars"]) == {"l4-run-0"}
    assert fleet.stats["by_method"] == {"compute.instances.list": 1}
    ((_method, _path, query, _body),) = fleet.requests
    assert query["filter"] == ["(status = RUNNING) (labels.forja = managed)"]


def test_metadata_values_only_when_asked_and_a_misspelt_zone_is_reported(fleet, key_file, tmp_path):
    source = write_config(
        tmp_path / "meta.gcp_gpu.yml", expose_metadata=True, zones=["us-central1-a", "us-centrall-b"]
    )
    proc = run_inventory(emulator_env(fleet, key_file), source)
    assert set(inventory_json(proc)["_meta"]["hostvars"]) == {"t4-box"}
    assert inventory_json(proc)["_meta"]["hostvars"]["t4-box"]["metadata"] == {"ssh-keys": SECRET}
    assert "zones: 'us-centrall-b' is not a zone of project 'forja-sandbox'" in " ".join(proc.stderr.split())


def test_the_cache_answers_without_a_request_until_flushed(fleet, key_file, tmp_path):
    source = write_config(
        tmp_path / "cached.gcp_gpu.yml",
        cache=True,
        cache_plugin="ansible.builtin.jsonfile",
        cache_connection=str(tmp_path / "cache"),
        cache_timeout=600,
    )
    env = emulator_env(fleet, key_file)
    cold = run_inventory(env, source)
    assert cold.returncode == 0, cold.stderr
    after_cold = fleet.stats
    warm = run_inventory(env, source)
    assert inventory_json(warm) == inventory_json(cold)
    assert fleet.stats == after_cold, "a cache hit makes no token or API request"
    flushed = run_inventory(env, source, extra=("--flush-cache",))
    assert flushed.returncode == 0
    assert fleet.stats["by_method"]["compute.instances.aggregatedList"] == 2


def test_failures_name_the_project_and_the_cause_and_are_never_silently_empty(emulator, key_file, tmp_path):
    missing_key = write_config(tmp_path / "nokey.gcp_gpu.yml", credentials_file=str(tmp_path / "gone.json"))
    unknown = write_config(tmp_path / "unknown.gcp_gpu.yml", projects=["no-such-project"])
    offline = write_config(
        tmp_path / "offline.gcp_gpu.yml", api_url="http://127.0.0.1:9/compute/v1/", retries=1
    )
    denied = write_config(tmp_path / "denied.gcp_gpu.yml", projects=["locked-project"])
    emulator.add_project("locked-project")
    emulator.faults.add(
        "instances.aggregatedList",
        status=403,
        project="locked-project",
        times=None,
        reason="forbidden",
        message="Required 'compute.instances.list' permission",
    )
    env = emulator_env(emulator, key_file, project=PROJECT)
    env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "false"
    proc = run_inventory(env, missing_key, unknown, offline, denied)
    text = " ".join(proc.stderr.split())
    # the cause first, in its own words, then the project it was listing
    assert "credentials_file:" in text and "gone.json' does not exist" in text
    assert f"(while listing the VMs of project '{PROJECT}')" in text
    assert "(while listing the VMs of project 'no-such-project')" in text and "What to do" in text
    assert "api_url" in text and "could not be reached" in text
    assert (
        "(while listing the VMs of project 'locked-project')" in text and "HTTP 403" in text
        and "compute.instanceAdmin" in text
    )
    env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] = "true"
    assert run_inventory(env, unknown).returncode != 0


@pytest.mark.slow  # over 7 s (bench/suite_times.py): the host tier, not make check
def test_5000_vms_in_20_zones_take_one_token_and_ten_pages(emulator, key_file, tmp_path):
    from forja_sandbox.compute_emulator.catalog import ZONES

    zones = sorted(ZONES)[:20]
    for index, zone in enumerate(zones):
        emulator.seed_instances(PROJECT, zone, 250, f"vm{index}", {"forja": "managed"})
    emulator.stats_reset()
    proc = run_inventory(emulator_env(emulator, key_file), write_config(tmp_path / "big.gcp_gpu.yml"))
    assert proc.returncode == 0, proc.stderr
    assert len(inventory_json(proc)["forja_gpu"]["hosts"]) == 5000
    assert emulator.stats["token_requests"] == 1
    assert emulator.stats["by_method"] == {"compute.instances.aggregatedList": math.ceil(5000 / 500)}


def shipped_source(name: str, folder, emulator, key_file):
    """A shipped inventory source (inventory/gcp_gpu.yml or inventory/sandbox/gcp_gpu.yml) as it is,
    pointed at this emulator and without its cache (the emulator changes between runs)."""
    source = yaml.safe_load((REPO / name).read_text())
    source.update(api_url=emulator.base_url, credentials_file=str(key_file), projects=[PROJECT], cache=False)
    folder.mkdir(exist_ok=True)
    path = folder / "gcp_gpu.yml"
    path.write_text(yaml.safe_dump(source))
    return path


@pytest.mark.parametrize(
    ("typo", "value", "meant"),
    [
        ("zone", ["us-east1-d"], "zones"),
        ("filter", ["status = RUNNING"], "filters"),
        ("credential_file", "/nowhere/key.json", "credentials_file"),
    ],
)
def test_a_misspelt_option_is_an_error_that_names_the_option_meant(
    fleet, key_file, tmp_path, typo, value, meant
):
    source = write_config(tmp_path / "typo.gcp_gpu.yml", **{typo: value})
    proc = run_inventory(emulator_env(fleet, key_file), source)
    assert proc.returncode != 0
    text = " ".join(proc.stderr.split())
    assert f"'{typo}' is not an option of forja.gpu.gcp_gpu; did you mean '{meant}'?" in text
    assert fleet.stats["requests"] == 0, "nothing is listed from a file with a typo"


@pytest.mark.parametrize("name", ["inventory/gcp_gpu.yml", "inventory/sandbox/gcp_gpu.yml"])
def test_the_shipped_inventories_find_forjas_vms_in_every_zone_and_only_those(
    emulator, key_file, tmp_path, name
):
    managed = {"forja": "managed"}
    emulator.seed_instances(PROJECT, "us-east1-d", 1, "primary", managed, machine_type="g2-standard-8")
    emulator.seed_instances(PROJECT, "us-central1-a", 1, "fallback", managed, machine_type="g2-standard-8")
    emulator.seed_instances(PROJECT, "europe-west4-a", 1, "elsewhere", managed, machine_type="g2-standard-8")
    emulator.seed_instances(PROJECT, "us-east1-d", 1, "web", {"team": "web"})
    emulator.stats_reset()
    proc = run_inventory(
        emulator_env(emulator, key_file), shipped_source(name, tmp_path / "inv", emulator, key_file)
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(inventory_json(proc)["forja_gpu"]["hosts"]) == ["elsewhere-0", "fallback-0", "primary-0"]
    assert "web-0" not in inventory_json(proc)["_meta"]["hostvars"]
    assert emulator.stats["by_method"] == {"compute.instances.aggregatedList": 1}
    ((_method, _path, query, _body),) = emulator.requests
    assert query["filter"] == ["(labels.forja = managed)"], "the label is filtered by the API"


def test_a_vm_a_stock_out_moved_to_a_fallback_zone_is_reached_by_the_later_plays(
    emulator, key_file, tmp_path
):
    folder = tmp_path / "inv"
    shipped_source("inventory/gcp_gpu.yml", folder, emulator, key_file)
    shutil.copytree(REPO / "inventory" / "group_vars", folder / "group_vars")
    emulator.faults.add(
        "instances.insert", error="ZONE_RESOURCE_POOL_EXHAUSTED", zone="us-east1-d", times=None
    )
    env = emulator_env(emulator, key_file)
    made = run_playbook(
        env,
        folder,
        "playbooks/provision.yml",
        "-e",
        "gcp_instance_wait_for_ssh=false",
        "-e",
        '{"gcp_instance_fallback_zones": ["us-central1-a"]}',
    )
    assert made.returncode == 0, made.stdout[-4000:] + made.stderr[-2000:]
    assert emulator.instance(PROJECT, "us-central1-a", "forja-l4")["status"] == "RUNNING"
    assert re.search(r"^forja-l4\s+: ok=", made.stdout, re.M), "the wait play reached the moved VM"
    later = run_playbook(env, folder, "playbooks/summary.yml")
    assert later.returncode == 0, later.stdout[-4000:]
    recap = dict(re.findall(r"^(\S+)\s+: ok=(\d+)", later.stdout, re.M))
    # the summary and settling the SSH settings (require_hosts.yml) on the VM; the check of the
    # inventory ends its play on the controller without a recap line
    assert recap == {"forja-l4": "2"}, recap


def test_a_play_that_finds_no_host_fails_naming_the_inventory_and_the_zones(emulator, key_file, tmp_path):
    source = shipped_source("inventory/sandbox/gcp_gpu.yml", tmp_path / "inv", emulator, key_file)
    emulator.seed_instances(PROJECT, "us-east1-d", 1, "web", {"team": "web"})
    env = emulator_env(emulator, key_file)
    for name, extra in [
        ("playbooks/gpu.yml", ()),
        ("playbooks/train_fetch.yml", ("-e", "forja_hosts=forja-l4")),
    ]:
        proc = run_playbook(env, source, name, *extra)
        assert proc.returncode != 0, proc.stdout[-3000:]
        text = " ".join(proc.stdout.split())
        pattern = extra[1].split("=")[1] if extra else "forja_gpu"
        assert f"No host to act on: '{pattern}' matches no host of the inventory {source}." in text
        assert f"{source} listed project '{PROJECT}' in every zone (" in text
        assert (
            "us-east1-d" in text
            and "us-central1-a" in text
            and "with filter (labels.forja = managed)" in text
        )
        assert "forja up" in text


def test_a_cache_hit_still_says_where_it_looked_and_an_edited_file_misses(fleet, key_file, tmp_path):
    options = {
        "cache": True,
        "cache_plugin": "ansible.builtin.jsonfile",
        "cache_connection": str(tmp_path / "cache"),
        "cache_timeout": 600,
        "managed_only": True,
    }
    source = write_config(tmp_path / "cached.gcp_gpu.yml", **options, filters=["name = nosuch-*"])
    env = emulator_env(fleet, key_file)
    assert run_inventory(env, source).returncode == 0
    listed = fleet.stats["by_method"]["compute.instances.aggregatedList"]
    proc = run_playbook(env, source, "playbooks/summary.yml")
    assert fleet.stats["by_method"]["compute.instances.aggregatedList"] == listed, "a cache hit"
    assert proc.returncode != 0
    text = " ".join(proc.stdout.split())
    assert "listed project 'forja-sandbox' in every zone (" in text
    assert "with filter (name = nosuch-*) (labels.forja = managed)" in text
    write_config(source, **options)
    edited = run_inventory(env, source)
    assert fleet.stats["by_method"]["compute.instances.aggregatedList"] == listed + 1, "the edit is a miss"
    assert sorted(inventory_json(edited)["forja_gpu"]["hosts"]) == ["l4-run-0", "l4-stop-0", "t4-box"]
    assert "gcp_gpu_searched" not in inventory_json(edited)["_meta"]["hostvars"]["t4-box"], (
        "a source that found forja's VMs adds nothing to every host's variables"
    )
