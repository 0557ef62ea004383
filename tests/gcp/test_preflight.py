"""The preflight (gcp_gpu_preflight, the role's `check` entry point, `forja check`) against the emulator.

Each check is made to fail by the emulator's project settings, one project per case, so that one
ansible-playbook run asks them all through the module's real path (its in-process action, over HTTP
to the emulator). The CLI's own tests then run `forja check` and `forja up` on a brand-new project:
what the user meets first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gcp_helpers import REPO, emulator_env, run_module_tasks

FORJA = str(Path(sys.executable).parent / "forja")
#: The sandbox's IAP stand-in: on PATH wherever the tests run, unlike gcloud.
IAP_COMMAND = f"{sys.executable} -m forja_sandbox.iap start-iap-tunnel"
#: What a check never calls: anything that would create, change or delete.
MUTATIONS = ("insert", "delete", "patch", "update", "set", "start", "stop", "reset", "add", "remove")

CASES = {
    "ready": {},
    "quota-zero": {"quotas": {("us-east1", "NVIDIA_L4_GPUS"): 0, ("global", "GPUS_ALL_REGIONS"): 0}},
    "spot-standard-quota": {"quotas": {("us-east1", "PREEMPTIBLE_NVIDIA_L4_GPUS"): 0}},
    "no-compute": {"disabled_services": ["compute.googleapis.com"]},
    "no-iap-role": {"denied_permissions": ["iap.tunnelInstances.accessViaIAP"]},
    "no-billing": {"billing_enabled": False},
    "no-storage": {"disabled_services": ["storage.googleapis.com"]},
    "not-yours": {"viewers": ["someone@elsewhere.iam.gserviceaccount.com"]},
}


def _by(result: dict, check: str, subject: str | None = None) -> dict:
    found = [f for f in result["findings"]
             if f["check"] == check and (subject is None or f["subject"] == subject)]
    assert found, f"no {check} {subject or ''} finding in {json.dumps(result['findings'], indent=1)}"
    return found[0]


def _failed(result: dict) -> list[tuple[str, str]]:
    return [(f["check"], f["subject"]) for f in result["findings"] if f["status"] == "fail"]


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every case's findings, from one playbook run, and the emulator's request log."""
    from forja_sandbox.compute_emulator import ComputeEmulator

    tmp = tmp_path_factory.mktemp("preflight")
    with ComputeEmulator() as emu:
        key = emu.write_service_account_key(tmp / "sa.json")
        for project, settings in CASES.items():
            emu.configure_project(project, **settings)
        emu.new_project("brand-new")
        emu.stats_reset()
        base = {"zone": "us-east1-d", "iap_command": IAP_COMMAND, "ssh_key_file": str(tmp / "no-key")}
        tasks = [{"register": p.replace("-", "_"), "forja.gpu.gcp_gpu_preflight": {**base, "project": p}}
                 for p in [*CASES, "brand-new"]]
        tasks += [
            {"register": "spot", "forja.gpu.gcp_gpu_preflight": {**base, "project": "spot-standard-quota",
                                                               "spot": True}},
            {"register": "bucket", "forja.gpu.gcp_gpu_preflight": {**base, "project": "no-storage",
                                                                 "features": ["bucket"]}},
            {"register": "typo", "forja.gpu.gcp_gpu_preflight": {**base, "project": "quota-zer0"}},
            {"register": "no_zone", "forja.gpu.gcp_gpu_preflight": {**base, "project": "ready",
                                                                  "zone": "us-east1-x"}},
            {"register": "no_l4", "forja.gpu.gcp_gpu_preflight": {**base, "project": "ready",
                                                                "fallback_zones": ["us-east1-c"]}},
            {"register": "n1_l4", "forja.gpu.gcp_gpu_preflight": {**base, "project": "ready",
                                                                "machine_type": "n1-standard-8",
                                                                "gpu_type": "nvidia-l4", "gpu_count": 1}},
            {"register": "no_image", "forja.gpu.gcp_gpu_preflight": {
                **base, "project": "ready", "image_family": "pytorch-9-9-cu999-nvidia-999"}},
            {"register": "no_gcloud", "forja.gpu.gcp_gpu_preflight": {**base, "project": "ready",
                                                                    "iap_command": "no-such-gcloud x"}},
        ]
        results = run_module_tasks(tmp, emulator_env(emu, key, project="ready"), tasks)
        results["_calls"] = dict(emu.stats["by_method"])
    return results


def test_a_ready_project_passes_every_check_and_prices_the_vm(checked: dict) -> None:
    ready = checked["ready"]
    assert not ready.get("failed"), ready.get("msg")
    assert ready["blocking"] is False and _failed(ready) == []
    assert [f["status"] for f in ready["findings"] if f["status"] not in ("ok",)] == []
    assert "a token was minted for the service account" in _by(ready, "credentials")["detail"]
    assert _by(ready, "quota", "NVIDIA_L4_GPUS (us-east1)")["detail"].endswith("forja-l4 needs 1")
    assert "carries cu128, nvidia-570" in _by(ready, "image")["detail"]
    price = _by(ready, "price")["detail"]
    assert "$0.85 an hour" in price and "$30.00 a month for the 300 GB disk while stopped" in price


def test_a_check_calls_nothing_that_creates_or_changes(checked: dict) -> None:
    calls = [m for m in checked["_calls"] if m.rsplit(".", 1)[-1].lower().startswith(MUTATIONS)]
    assert calls == [], calls


def test_gpu_quota_zero_names_the_quota_and_where_to_ask(checked: dict) -> None:
    result = checked["quota_zero"]
    assert result["blocking"]
    regional = _by(result, "quota", "NVIDIA_L4_GPUS (us-east1)")
    assert regional["status"] == "fail" and regional["detail"] == "limit 0, in use 0, forja-l4 needs 1"
    assert "request NVIDIA_L4_GPUS of at least 1 in us-east1" in regional["fix"]
    assert regional["link"].endswith("iam-admin/quotas?project=quota-zero&metric=NVIDIA_L4_GPUS")
    assert _by(result, "quota", "GPUS_ALL_REGIONS (all regions)")["status"] == "fail"


def test_spot_without_preemptible_quota_counts_against_the_standard_one(checked: dict) -> None:
    assert _by(checked["spot"], "quota", "NVIDIA_L4_GPUS (us-east1)")["status"] == "ok"
    assert checked["spot"]["blocking"] is False
    assert "Spot" in _by(checked["spot"], "price")["subject"]


def test_compute_disabled_gives_googles_activation_link(checked: dict) -> None:
    result = checked["no_compute"]
    api = _by(result, "api", "compute.googleapis.com")
    assert api["status"] == "fail"
    assert "gcloud services enable compute.googleapis.com --project no-compute" in api["fix"]
    # The link is the one Google's SERVICE_DISABLED body carries: it names the project by number.
    assert api["link"].startswith("https://console.developers.google.com/apis/api/compute.googleapis.com/")
    assert "project=no-compute" not in api["link"]
    assert {f["status"] for f in result["findings"] if f["check"] in ("placement", "image")} == {"skip"}


def test_a_missing_iap_permission_names_the_role_and_the_grant(checked: dict) -> None:
    result = checked["no_iap_role"]
    perms = _by(result, "permissions")
    assert perms["status"] == "fail" and perms["detail"] == "lacks iap.tunnelInstances.accessViaIAP"
    assert "--role=roles/iap.tunnelResourceAccessor" in perms["fix"]
    assert "--member=serviceAccount:" in perms["fix"]


def test_billing_off_blocks_with_the_page_that_links_an_account(checked: dict) -> None:
    billing = _by(checked["no_billing"], "billing")
    assert billing["status"] == "fail"
    assert billing["link"].endswith("/billing/linkedaccount?project=no-billing")


def test_a_bucket_needs_cloud_storage_on_only_when_one_is_set(checked: dict) -> None:
    assert _by(checked["bucket"], "api", "storage.googleapis.com")["status"] == "fail"
    assert not [f for f in checked["no_storage"]["findings"] if f["subject"] == "storage.googleapis.com"]


def test_a_brand_new_project_names_all_three_problems_at_once(checked: dict) -> None:
    result = checked["brand_new"]
    assert _failed(result) == [("api", "compute.googleapis.com"), ("api", "iap.googleapis.com"),
                               ("permissions", _by(result, "permissions")["subject"])]
    quota = _by(result, "quota", "GPUs")
    assert quota["status"] == "warn" and "GPUS_ALL_REGIONS 0" in quota["detail"]
    assert "NVIDIA_L4_GPUS in us-east1 of at least 1" in quota["fix"]
    assert all(f"{f['check']} {f['subject']}" in result["summary"] for f in result["findings"]
               if f["status"] == "fail")


def test_a_project_id_with_a_typo_says_it_does_not_exist_and_suggests_the_close_one(checked: dict) -> None:
    project = _by(checked["typo"], "project")
    assert project["status"] == "fail"
    assert project["detail"] == "project 'quota-zer0' does not exist; did you mean 'quota-zero'?"
    assert {f["status"] for f in checked["typo"]["findings"] if f["check"] in ("billing", "api")} == {"skip"}


def test_a_project_you_may_not_use_is_told_apart_from_a_missing_one(checked: dict) -> None:
    project = _by(checked["not_yours"], "project")
    assert project["status"] == "fail"
    assert project["detail"].startswith("the service account forja-emulator@")
    assert "may not use project 'not-yours' (HTTP 403" in project["detail"]
    assert "grant the account a role on the project" in project["fix"]


def test_a_zone_that_does_not_exist_is_named_with_its_neighbours(checked: dict) -> None:
    zone = _by(checked["no_zone"], "placement", "us-east1-x")
    assert zone["status"] == "fail" and zone["detail"].startswith("zone 'us-east1-x' does not exist")
    assert "us-east1-d" in zone["detail"]


def test_a_fallback_zone_without_the_l4_blocks(checked: dict) -> None:
    assert _by(checked["no_l4"], "placement", "us-east1-d")["status"] == "ok"
    fallback = _by(checked["no_l4"], "placement", "us-east1-c")
    assert fallback["status"] == "fail" and fallback["detail"] == "g2-standard-8 is not offered in us-east1-c"


def test_a_machine_type_that_cannot_take_the_gpu_names_the_field(checked: dict) -> None:
    placement = _by(checked["n1_l4"], "placement")
    assert placement["status"] == "fail" and placement["detail"].startswith("gpu_type: nvidia-l4 is only")
    assert "g2-standard-8" in placement["fix"]


def test_an_image_family_that_does_not_resolve_blocks(checked: dict) -> None:
    image = _by(checked["no_image"], "image")
    assert image["status"] == "fail"
    assert image["detail"] == ("image family pytorch-9-9-cu999-nvidia-999 does not exist in project "
                               "deeplearning-platform-release")


def test_the_iap_path_without_its_command_on_path_blocks(checked: dict) -> None:
    tunnel = _by(checked["no_gcloud"], "this machine", "IAP tunnel")
    assert tunnel["status"] == "fail" and "no-such-gcloud is not on PATH" in tunnel["detail"]
    assert "https://cloud.google.com/sdk/docs/install" in tunnel["fix"]


# -- credentials: each case needs its own environment ----------------------------------------------
@pytest.fixture(scope="module")
def credential_cases(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from forja_sandbox.compute_emulator import ComputeEmulator

    tmp = tmp_path_factory.mktemp("credentials")
    client_secret = tmp / "client_secret.json"
    client_secret.write_text(json.dumps({"installed": {
        "client_id": "x.apps.googleusercontent.com", "client_secret": "s", "redirect_uris": ["http://localhost"]}}))
    with ComputeEmulator() as emu:
        key = emu.write_service_account_key(tmp / "sa.json")
        env = emulator_env(emu, key)
        del env["FORJA_GCP_CREDENTIALS_FILE"]
        env["HOME"] = str(tmp)  # no application default credentials there either
        base = {"zone": "us-east1-d", "iap_command": IAP_COMMAND}
        return run_module_tasks(tmp, env, [
            {"register": "nothing", "forja.gpu.gcp_gpu_preflight": base},
            {"register": "client_secret",
             "forja.gpu.gcp_gpu_preflight": {**base, "credentials_file": str(client_secret)}},
        ])


def test_no_credentials_fails_the_credentials_check_and_skips_what_needs_them(credential_cases: dict) -> None:
    result = credential_cases["nothing"]
    creds = _by(result, "credentials")
    assert creds["status"] == "fail" and creds["subject"] == "application default credentials"
    assert "gcloud auth application-default login" in creds["fix"]
    assert {f["status"] for f in result["findings"] if f["check"] in ("project", "quota")} == {"skip"}
    assert _by(result, "price")["status"] == "ok"  # what it would cost is known without an account


def test_an_oauth_client_secret_is_refused_as_a_key(credential_cases: dict) -> None:
    creds = _by(credential_cases["client_secret"], "credentials")
    assert creds["status"] == "fail" and "client_secret.json" in creds["subject"]
    assert "service-account" in creds["detail"]


# -- the CLI: forja check and forja up on a brand-new project ---------------------------------------
@pytest.fixture
def new_project(tmp_path: Path):
    from forja_sandbox.compute_emulator import ComputeEmulator

    with ComputeEmulator() as emu:
        key = emu.write_service_account_key(tmp_path / "sa.json")
        emu.new_project("forja-sandbox")
        inventory = tmp_path / "inventory"
        (inventory / "group_vars" / "all").mkdir(parents=True)
        (inventory / "hosts.yml").write_text("all:\n  hosts: {}\n")
        (inventory / "group_vars" / "all" / "vm.yml").write_text(
            f"gcp_instance_ssh_iap_command: {IAP_COMMAND}\ngcp_instance_ssh_key_file: {tmp_path / 'id'}\n")
        env = {**emulator_env(emu, key), "FORJA_HOME": str(tmp_path / "home"), "PATH": os.environ["PATH"]}
        emu.stats_reset()
        yield emu, env, inventory


def _forja(env: dict, inventory: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([FORJA, "-i", str(inventory), *argv], env=env, cwd=inventory.parent,
                          capture_output=True, text=True, timeout=300, check=False)


def test_forja_check_on_a_new_project_names_the_three_problems_and_exits_9(new_project) -> None:
    emu, env, inventory = new_project
    started = time.monotonic()
    proc = _forja(env, inventory, "check")
    took = time.monotonic() - started
    assert proc.returncode == 9, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "3 problems to fix before forja up" in out
    for words in ("Compute Engine API is disabled", "Cloud Identity-Aware Proxy API is disabled",
                  "lacks iap.tunnelInstances.accessViaIAP", "GPUS_ALL_REGIONS 0"):
        assert words in out, (words, proc.stdout)
    assert emu.instances() == []
    print(f"forja check on a brand-new project: {took:.1f} s")

    as_json = json.loads(_forja(env, inventory, "--json", "check").stdout)
    assert as_json["blocking"] is True and as_json["project"] == "forja-sandbox"
    assert [f["subject"] for f in as_json["findings"] if f["status"] == "fail"][:2] == [
        "compute.googleapis.com", "iap.googleapis.com"]


def test_forja_up_checks_first_and_creates_nothing(new_project) -> None:
    emu, env, inventory = new_project
    proc = _forja(env, inventory, "up")
    assert proc.returncode == 9, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "nothing was created: the check found 3 problems" in err
    assert "gcloud services enable compute.googleapis.com --project forja-sandbox" in err
    assert "task '" not in err
    assert emu.instances() == []
    # --no-check goes on to Compute Engine, which refuses with Google's own reason and link.
    proc = _forja(env, inventory, "up", "--no-check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert "gcloud services enable compute.googleapis.com" in err and "console.developers.google.com" in err
    assert emu.instances() == []


def test_the_playbook_fails_on_a_blocking_finding_for_ansible_users(new_project) -> None:
    _emu, env, inventory = new_project
    playbook = [str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory), "playbooks/check.yml"]
    proc = subprocess.run(playbook, cwd=REPO, env=emulator_env(_emu, Path(env["FORJA_GCP_CREDENTIALS_FILE"])),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout
    assert "Nothing was created: api compute.googleapis.com: Compute Engine API is disabled" in proc.stdout
