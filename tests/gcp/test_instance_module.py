"""gcp_gpu_instance via ansible-playbook against the emulator: lifecycle, check mode, diff, Spot, fallback.

Each test is one ansible-playbook run of several steps (a run costs seconds; a step, a fraction).
"""

from __future__ import annotations

from gcp_helpers import emulator_env, role_vm, run_module_tasks

PROJECT = "forja-sandbox"
VM = {
    "name": "forja-l4",
    **role_vm(),
    "ssh_keys": ["ansible:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDoNotLeakMe ansible@test"],
}


def vm(**options):
    return {"forja.gpu.gcp_gpu_instance": {**VM, **options}}


def test_lifecycle_is_idempotent_with_check_mode_diff_and_fingerprints(emulator, key_file, tmp_path):
    emulator.faults.add(
        "instances.setMetadata",
        status=412,
        times=1,
        reason="conditionNotMet",
        message="Supplied fingerprint does not match current metadata fingerprint.",
    )
    results = run_module_tasks(
        tmp_path,
        emulator_env(emulator, key_file),
        [
            {**vm(), "register": "planned", "check_mode": True, "diff": True},
            {**vm(), "register": "created", "diff": True},
            {**vm(), "register": "again"},
            {
                **vm(state="stopped", labels={"owner": "bob"}),
                "register": "plan_stop",
                "check_mode": True,
                "diff": True,
            },
            {**vm(state="stopped"), "register": "stopped"},
            {**vm(state="stopped"), "register": "stopped_again"},
            {**vm(state="started"), "register": "started"},
            {**vm(labels={"owner": "alice"}), "register": "relabelled", "diff": True},
            {**vm(labels={"owner": "alice"}), "register": "relabelled_again"},
            {**vm(metadata={"team": "ml"}), "register": "metadata", "diff": True},
            {**vm(metadata={"team": "ml"}), "register": "metadata_again"},
            {**vm(tags=["forja-ssh", "gpu"]), "register": "retagged"},
            {**vm(tags=["gpu", "forja-ssh"]), "register": "retagged_again"},
            {**vm(state="absent"), "register": "deleted_check", "check_mode": True},
            {**vm(state="absent"), "register": "deleted"},
            {**vm(state="absent"), "register": "deleted_again"},
        ],
    )
    planned, created = results["planned"], results["created"]
    assert planned["changed"] and planned["actions"] == ["insert in us-east1-d"]
    assert planned["diff"]["before"] == {} and planned["diff"]["after"]["machine_type"] == "g2-standard-8"
    assert created["changed"], created
    facts = created["instance"]
    assert facts["zone"] == "us-east1-d" and facts["status"] == "RUNNING"
    assert (facts["machine_type"], facts["gpu_type"], facts["gpu_count"]) == ("g2-standard-8", "nvidia-l4", 1)
    assert facts["provisioning_model"] == "STANDARD" and facts["labels"]["forja"] == "managed"
    assert facts["ip"] and facts["ip"] == facts["public_ip"] and facts["private_ip"]
    for key in ("self_link", "creation_timestamp", "last_start_timestamp", "last_stop_timestamp"):
        assert key in facts
    assert results["again"]["changed"] is False, results["again"]
    insert = next(b for m, _p, _q, b in emulator.requests if m == "compute.instances.insert")
    assert insert["machineType"] == "zones/us-east1-d/machineTypes/g2-standard-8"
    assert "guestAccelerators" not in insert, "g2-standard-8 brings its L4"
    assert insert["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert insert["disks"][0]["interface"] == "NVME"
    assert insert["disks"][0]["initializeParams"] == {
        "sourceImage": "projects/deeplearning-platform-release/global/images/family/"
        "pytorch-2-7-cu128-ubuntu-2204-nvidia-570",
        "diskSizeGb": "300",
        "diskType": "zones/us-east1-d/diskTypes/pd-balanced",
    }

    plan_stop = results["plan_stop"]
    assert plan_stop["changed"] and plan_stop["actions"] == ["setLabels", "stop"]
    assert plan_stop["diff"]["after"]["status"] == "TERMINATED"
    assert results["stopped"]["changed"], "check mode must not have stopped the VM"
    assert results["stopped"]["instance"]["status"] == "TERMINATED"
    assert results["stopped"]["instance"]["last_stop_timestamp"]
    assert results["stopped_again"]["changed"] is False
    assert results["started"]["changed"] and results["started"]["instance"]["status"] == "RUNNING"

    relabelled = results["relabelled"]
    assert relabelled["actions"] == ["setLabels"], "check mode must not have set labels"
    assert relabelled["diff"]["after"]["labels"] == {"forja": "managed", "owner": "alice"}
    assert results["relabelled_again"]["changed"] is False
    metadata = results["metadata"]
    assert metadata["actions"] == ["setMetadata"] and metadata["instance"]["metadata_keys"] == [
        "ssh-keys",
        "team",
    ]
    assert metadata["diff"]["after"]["metadata"]["team"].startswith("sha256:")
    assert emulator.stats["by_method"]["compute.instances.setMetadata"] == 2, (
        "412 is re-read and retried once"
    )
    assert results["metadata_again"]["changed"] is False
    assert results["retagged"]["actions"] == ["setTags"]
    assert results["retagged"]["instance"]["tags"] == ["forja-ssh", "gpu"]
    assert results["retagged_again"]["changed"] is False, "tags compare as a set"

    assert results["deleted_check"]["changed"]
    assert results["deleted"]["changed"] and results["deleted_again"]["changed"] is False
    assert emulator.instances(PROJECT) == []
    assert "DoNotLeakMe" not in results["_stdout"]


def test_spot_stock_out_falls_back_in_order_and_never_leaves_half_made_vms(emulator, key_file, tmp_path):
    emulator.faults.add(
        "instances.insert", error="ZONE_RESOURCE_POOL_EXHAUSTED", zone="us-east1-d", times=None
    )
    spot = {"spot": True, "instance_termination_action": "DELETE"}
    results = run_module_tasks(
        tmp_path,
        emulator_env(emulator, key_file),
        [
            {**vm(fallback_zones=["us-east1-b"], **spot), "register": "made"},
            {**vm(fallback_zones=["us-east1-b"], **spot), "register": "again"},
            {**vm(name="forja-l4-solo", **spot), "register": "nowhere"},
            {
                **vm(name="forja-l4-cold", zone="us-east1-b", state="stopped", create_if_missing=True),
                "register": "cold",
            },
        ],
    )
    made = results["made"]
    assert made["zone"] == "us-east1-b"
    assert made["zones_tried"] == [
        {"zone": "us-east1-d", "error": "ZONE_RESOURCE_POOL_EXHAUSTED"},
        {"zone": "us-east1-b", "error": None},
    ]
    assert made["instance"]["provisioning_model"] == "SPOT"
    assert made["instance"]["instance_termination_action"] == "DELETE"
    assert results["again"]["changed"] is False and results["again"]["zone"] == "us-east1-b"
    nowhere = results["nowhere"]
    assert nowhere["failed"] and nowhere["error_code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert "us-east1-d" in nowhere["msg"] and "fallback_zones" in nowhere["msg"]
    assert nowhere["changed"] is False, "the failed inserts left nothing behind"
    assert results["cold"]["actions"] == ["insert in us-east1-b", "stop"]
    assert results["cold"]["instance"]["status"] == "TERMINATED"
    emulator_vms = [(i["name"], i["zone"].rsplit("/", 1)[-1]) for i in emulator.instances(PROJECT)]
    assert sorted(emulator_vms) == [("forja-l4", "us-east1-b"), ("forja-l4-cold", "us-east1-b")]


def test_a_preempted_spot_vm_is_started_again_and_the_preemption_is_reported(emulator, key_file, tmp_path):
    env = emulator_env(emulator, key_file)
    spot = vm(spot=True, state="started", create_if_missing=True)  # as playbooks/provision.yml runs it
    for step in ("made", "after"):
        (tmp_path / step).mkdir()
    made = run_module_tasks(tmp_path / "made", env, [{**spot, "register": "made"}])["made"]
    assert made["instance"]["status"] == "RUNNING"
    emulator.preempt(PROJECT, made["zone"], "forja-l4")
    results = run_module_tasks(
        tmp_path / "after",
        env,
        [
            {**spot, "register": "planned", "check_mode": True},
            {**spot, "register": "restarted"},
            {**spot, "register": "again"},
            {**vm(spot=True, state="stopped"), "register": "stopped_by_user"},
            {**spot, "register": "restarted_by_user"},
        ],
    )
    assert results["planned"]["actions"] == ["start"] and results["planned"]["preempted_at"]
    restarted = results["restarted"]
    assert restarted["actions"] == ["start"] and restarted["instance"]["status"] == "RUNNING"
    assert restarted["preempted_at"] == results["planned"]["preempted_at"]
    assert results["again"]["changed"] is False and "preempted_at" not in results["again"]
    # a Spot VM the user stopped is started without being called preempted
    assert results["restarted_by_user"]["actions"] == ["start"]
    assert "preempted_at" not in results["restarted_by_user"]


def test_started_or_stopped_on_a_missing_vm_fails_naming_it_and_creates_nothing(emulator, key_file, tmp_path):
    typo = {"name": "forja-l4-typo", "fallback_zones": ["us-east1-b"]}
    results = run_module_tasks(
        tmp_path,
        emulator_env(emulator, key_file),
        [
            {**vm(state="stopped", **typo), "register": "stopped"},
            {**vm(state="started", **typo), "register": "started"},
            {**vm(state="stopped", **typo), "register": "planned", "check_mode": True},
        ],
    )
    for step in ("stopped", "started", "planned"):
        result = results[step]
        assert result["failed"] and result["changed"] is False, (step, result)
        msg = result["msg"]
        assert msg.startswith("name: no VM 'forja-l4-typo' in project 'forja-sandbox'"), msg
        assert "zones us-east1-d, us-east1-b" in msg and "create_if_missing: true" in msg, msg
    assert "nothing to stop" in results["stopped"]["msg"] and "nothing to start" in results["started"]["msg"]
    assert emulator.instances(PROJECT) == []
    assert "compute.instances.insert" not in emulator.stats["by_method"]


def test_create_if_missing_creates_and_an_existing_vm_needs_no_shape_options(emulator, key_file, tmp_path):
    only_where = {"forja.gpu.gcp_gpu_instance": {"name": "forja-l4", "zone": "us-east1-d"}}
    results = run_module_tasks(
        tmp_path,
        emulator_env(emulator, key_file),
        [
            {**vm(state="started", create_if_missing=True), "register": "created"},
            {**vm(state="started", create_if_missing=True), "register": "again"},
            {**only_where, "register": "present_bare"},
            {
                "forja.gpu.gcp_gpu_instance": {
                    **only_where["forja.gpu.gcp_gpu_instance"],
                    "state": "stopped",
                },
                "register": "stopped_bare",
            },
            {
                "forja.gpu.gcp_gpu_instance": {"name": "forja-l4-new", "zone": "us-east1-d"},
                "register": "create_bare",
            },
        ],
    )
    created = results["created"]
    assert created["actions"] == ["insert in us-east1-d"] and created["instance"]["status"] == "RUNNING"
    assert results["again"]["changed"] is False
    # unset shape options are not compared with the VM: nothing differs, nothing is required
    assert results["present_bare"]["changed"] is False, results["present_bare"]
    assert results["stopped_bare"]["actions"] == ["stop"]
    assert results["stopped_bare"]["instance"]["status"] == "TERMINATED"
    # but creating needs a machine type (the module states no VM; the role passes its defaults)
    bare = results["create_bare"]
    assert bare["failed"] and bare["msg"].startswith("machine_type: required to create the VM"), bare
    assert [i["name"] for i in emulator.instances(PROJECT)] == ["forja-l4"]
