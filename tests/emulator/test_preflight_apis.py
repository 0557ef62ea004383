"""What a preflight check asks Google, served by the emulator, and the knobs that make each answer fail.

Quotas (`regions.get`, `projects.get`), API enablement (Service Usage, and SERVICE_DISABLED from
every API), the project itself and its permissions (Resource Manager v3), billing (Cloud Billing
v1). Each knob of `configure_project` / `new_project` has a test that turns its answer into a
failure, over real HTTP with bearer tokens; `tests/gcp/test_google_clients.py` drives the same
calls with Google's own client libraries. The last tests hold the routes and fields against
Google's discovery documents (those google-api-python-client ships).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import googleapiclient
import pytest
import requests
from emulator_helpers import PROJECT, ZONE, Client, l4_body, small_body

from forja_sandbox.compute_emulator import ComputeEmulator
from forja_sandbox.compute_emulator.catalog import project_number

REGION = "us-east1"
DOCUMENTS = Path(os.path.dirname(googleapiclient.__file__)) / "discovery_cache" / "documents"
#: The caller of every `client`: its key belongs to PROJECT (tester@forja-sandbox.iam...).
CALLER_PROJECT = PROJECT


def api(client: Client, path: str) -> str:
    """A URL of a non-Compute API on the emulator's origin (`serviceusage/v1/...`)."""
    return f"{client.emu.url}/{path}"


def google(client: Client, path: str, **params: Any) -> requests.Response:
    return client.get(api(client, path), **params)


def quotas_of(resource: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {q["metric"]: (q["limit"], q["usage"]) for q in resource["quotas"]}


def region_quotas(client: Client, project: str = PROJECT, region: str = REGION) -> dict[str, Any]:
    return quotas_of(client.ok(client.get(f"{client.emu.base_url}projects/{project}/regions/{region}")))


def spot_l4(name: str) -> dict[str, Any]:
    return l4_body(name, scheduling={"onHostMaintenance": "TERMINATE", "provisioningModel": "SPOT"})


def assert_service_disabled(response: requests.Response, service: str, title: str, project: str) -> None:
    """Google's SERVICE_DISABLED body, field by field, for `project`'s number."""
    number = project_number(project)
    url = f"https://console.developers.google.com/apis/api/{service}/overview?project={number}"
    message = (
        f"{title} has not been used in project {number} before or it is disabled. Enable it by visiting "
        f"{url} then retry. If you enabled this API recently, wait a few minutes for the action to "
        "propagate to our systems and retry."
    )
    assert response.status_code == 403, response.text
    assert response.json() == {
        "error": {
            "code": 403,
            "message": message,
            "errors": [
                {
                    "message": message,
                    "domain": "usageLimits",
                    "reason": "accessNotConfigured",
                    "extendedHelp": "https://console.developers.google.com",
                }
            ],
            "status": "PERMISSION_DENIED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "SERVICE_DISABLED",
                    "domain": "googleapis.com",
                    "metadata": {
                        "service": service,
                        "consumer": f"projects/{number}",
                        "activationUrl": url,
                        "serviceTitle": title,
                        "containerInfo": number,
                    },
                },
                {
                    "@type": "type.googleapis.com/google.rpc.LocalizedMessage",
                    "locale": "en-US",
                    "message": message,
                },
                {
                    "@type": "type.googleapis.com/google.rpc.Help",
                    "links": [{"description": "Google developers console API activation", "url": url}],
                },
            ],
        }
    }


# -- quotas ------------------------------------------------------------------------------------


def test_a_region_reports_its_limits_and_what_instances_use(emu: ComputeEmulator, client: Client) -> None:
    client.insert(l4_body("standard-l4"))  # g2-standard-8: 8 vCPUs, 1 L4, 300 GB pd-balanced
    client.insert(spot_l4("spot-l4"))
    client.insert(small_body("web"))  # e2-standard-4, 10 GB pd-standard
    quotas = region_quotas(client)
    assert {"CPUS", "PREEMPTIBLE_CPUS", "NVIDIA_L4_GPUS", "PREEMPTIBLE_NVIDIA_L4_GPUS", "NVIDIA_T4_GPUS",
            "PREEMPTIBLE_NVIDIA_T4_GPUS", "SSD_TOTAL_GB", "DISKS_TOTAL_GB", "INSTANCES",
            "IN_USE_ADDRESSES"} <= set(quotas)  # fmt: skip
    assert quotas["CPUS"] == (24000, 8 + 4)
    assert quotas["PREEMPTIBLE_CPUS"] == (24000, 8)  # Spot counts against the preemptible metrics
    assert quotas["NVIDIA_L4_GPUS"] == (16, 1)
    assert quotas["PREEMPTIBLE_NVIDIA_L4_GPUS"] == (16, 1)
    assert quotas["SSD_TOTAL_GB"] == (204800, 600)
    assert quotas["DISKS_TOTAL_GB"] == (409600, 10)
    assert quotas["INSTANCES"] == (24000, 3)
    assert quotas["IN_USE_ADDRESSES"] == (8000, 3)
    assert region_quotas(client, region="us-central1")["CPUS"] == (24000, 0)
    project = client.ok(client.get(f"{emu.base_url}projects/{PROJECT}"))
    assert project["id"] == project_number(PROJECT)
    assert quotas_of(project)["GPUS_ALL_REGIONS"] == (32, 2)

    client.wait(client.ok(client.post(f"zones/{ZONE}/instances/standard-l4/stop")))
    quotas = region_quotas(client)  # a stopped VM holds no CPUs, GPUs or address; its disk stays
    assert (quotas["CPUS"][1], quotas["NVIDIA_L4_GPUS"][1], quotas["IN_USE_ADDRESSES"][1]) == (4, 0, 2)
    assert quotas["SSD_TOTAL_GB"][1] == 600 and quotas["INSTANCES"][1] == 3


def test_spot_uses_the_standard_quota_where_no_preemptible_quota_is_granted(
    emu: ComputeEmulator, client: Client
) -> None:
    quotas = {(REGION, "PREEMPTIBLE_NVIDIA_L4_GPUS"): 0, "*/PREEMPTIBLE_CPUS": 0}  # both key forms
    emu.configure_project(PROJECT, quotas=quotas)
    client.insert(spot_l4("spot-l4"))
    quotas = region_quotas(client)
    assert quotas["NVIDIA_L4_GPUS"] == (16, 1) and quotas["PREEMPTIBLE_NVIDIA_L4_GPUS"] == (0, 0)
    assert quotas["CPUS"][1] == 8 and quotas["PREEMPTIBLE_CPUS"] == (0, 0)


def test_regions_list_and_an_unknown_region(client: Client) -> None:
    listing = client.ok(client.get(f"{client.emu.base_url}projects/{PROJECT}/regions"))
    assert listing["kind"] == "compute#regionList"
    regions = {r["name"]: r for r in listing["items"]}
    assert set(regions) >= {"us-east1", "us-central1", "europe-west4", "asia-southeast1"}
    zones = [z.rsplit("/", 1)[-1] for z in regions["us-east1"]["zones"]]
    assert zones == ["us-east1-b", "us-east1-c", "us-east1-d"]
    assert regions["us-east1"]["status"] == "UP" and regions["us-east1"]["quotas"]
    missing = client.get(f"{client.emu.base_url}projects/{PROJECT}/regions/mars-north1")
    assert missing.status_code == 404
    message = missing.json()["error"]["message"]
    assert message == f"The resource 'projects/{PROJECT}/regions/mars-north1' was not found"


@pytest.mark.parametrize(
    ("quota", "message"),
    [
        ((REGION, "NVIDIA_L4_GPUS"), "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-east1."),
        (("global", "GPUS_ALL_REGIONS"), "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."),
        ((REGION, "SSD_TOTAL_GB"), "Quota 'SSD_TOTAL_GB' exceeded.  Limit: 0.0 in region us-east1."),
    ],
    ids=["regional-l4", "gpus-all-regions", "ssd"],
)
def test_a_zero_quota_fails_the_insert_with_googles_quota_exceeded(
    emu: ComputeEmulator, client: Client, quota: tuple[str, str], message: str
) -> None:
    emu.configure_project(PROJECT, quotas={quota: 0})
    if quota[0] == REGION:
        assert region_quotas(client)[quota[1]][0] == 0
    op = client.insert(l4_body("no-quota"))
    assert op["status"] == "DONE" and op["httpErrorStatusCode"] == 403
    assert op["error"]["errors"] == [{"code": "QUOTA_EXCEEDED", "message": message}]
    assert emu.instance(PROJECT, ZONE, "no-quota") is None
    if quota[1] != "SSD_TOTAL_GB":
        assert client.insert(small_body("no-gpu")).get("error") is None  # a VM without GPUs still fits


def test_the_quota_counts_what_is_already_there(emu: ComputeEmulator, client: Client) -> None:
    emu.configure_project(PROJECT, quotas={(REGION, "NVIDIA_L4_GPUS"): 1})
    assert "error" not in client.insert(l4_body("first"))
    second = client.insert(l4_body("second", zone="us-east1-b"), zone="us-east1-b")
    assert second["error"]["errors"][0]["message"] == (
        "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 1.0 in region us-east1."
    )
    client.wait(client.ok(client.post(f"zones/{ZONE}/instances/first/stop")))
    again = client.insert(l4_body("second", zone="us-east1-b"), zone="us-east1-b")
    assert "error" not in again  # the stopped one freed its GPU


def test_quota_keys_are_checked(emu: ComputeEmulator) -> None:
    bad_keys = [(REGION, "NO_SUCH_METRIC"), ("global", "NVIDIA_L4_GPUS"), (REGION, "GPUS_ALL_REGIONS")]
    for bad in [{key: 1} for key in bad_keys] + [{"mars-north1/CPUS": 1}, {(REGION, "CPUS"): -1}]:
        with pytest.raises((ValueError, TypeError)):
            emu.configure_project(PROJECT, quotas=bad)
    assert emu.project_settings(PROJECT)["quotas"] == {}  # a refused change changes nothing


# -- API enablement ----------------------------------------------------------------------------


def test_service_usage_reports_each_apis_state(emu: ComputeEmulator, client: Client) -> None:
    number = project_number(PROJECT)
    emu.configure_project(PROJECT, disabled_services=["iap.googleapis.com"])
    compute = client.ok(google(client, f"serviceusage/v1/projects/{PROJECT}/services/compute.googleapis.com"))
    assert compute == {
        "name": f"projects/{number}/services/compute.googleapis.com",
        "config": {"name": "compute.googleapis.com", "title": "Compute Engine API"},
        "state": "ENABLED",
        "parent": f"projects/{number}",
    }
    names = [f"projects/{number}/services/{s}.googleapis.com" for s in ("iap", "storage", "aiplatform")]
    batch = client.ok(google(client, f"serviceusage/v1/projects/{number}/services:batchGet", names=names))
    assert [(s["config"]["name"], s["state"]) for s in batch["services"]] == [
        ("iap.googleapis.com", "DISABLED"),
        ("storage.googleapis.com", "ENABLED"),
        ("aiplatform.googleapis.com", "ENABLED"),
    ]
    for service in ("cloudresourcemanager", "cloudbilling", "serviceusage", "oslogin", "logging"):
        path = f"serviceusage/v1/projects/{PROJECT}/services/{service}.googleapis.com"
        got = client.ok(google(client, path))
        assert got["state"] == "ENABLED"

    unknown = client.get(api(client, f"serviceusage/v1/projects/{PROJECT}/services/nope.googleapis.com"))
    missing = google(client, "serviceusage/v1/projects/no-such-project/services/compute.googleapis.com")
    for refused, service in ((unknown, "nope.googleapis.com"), (missing, "compute.googleapis.com")):
        assert refused.status_code == 403
        assert refused.json()["error"]["message"] == f"Permission denied to get service [{service}]"
        assert refused.json()["error"]["details"][0]["reason"] == "AUTH_PERMISSION_DENIED"
    too_many = client.get(
        api(client, f"serviceusage/v1/projects/{PROJECT}/services:batchGet"),
        names=[f"projects/{PROJECT}/services/compute.googleapis.com"] * 31,
    )
    assert too_many.status_code == 400


def test_a_disabled_compute_api_answers_every_compute_call_with_service_disabled(
    emu: ComputeEmulator, client: Client
) -> None:
    emu.configure_project(PROJECT, disabled_services=["compute.googleapis.com"])
    for path in ("zones", f"zones/{ZONE}/instances", f"regions/{REGION}", ""):
        response = client.get(f"{emu.base_url}projects/{PROJECT}/{path}".rstrip("/"))
        assert_service_disabled(response, "compute.googleapis.com", "Compute Engine API", PROJECT)
    assert_service_disabled(client.post(f"zones/{ZONE}/instances", small_body("vm")),
                            "compute.googleapis.com", "Compute Engine API", PROJECT)  # fmt: skip
    state = client.ok(google(client, f"serviceusage/v1/projects/{PROJECT}/services/compute.googleapis.com"))
    assert state["state"] == "DISABLED"
    emu.configure_project(PROJECT, disabled_services=[])
    assert client.get("zones").status_code == 200


@pytest.mark.parametrize(
    ("service", "title", "path"),
    [
        ("serviceusage.googleapis.com", "Service Usage API",
         "serviceusage/v1/projects/other-project/services/compute.googleapis.com"),
        ("cloudresourcemanager.googleapis.com", "Cloud Resource Manager API",
         "cloudresourcemanager/v3/projects/other-project"),
        ("cloudbilling.googleapis.com", "Cloud Billing API",
         "cloudbilling/v1/projects/other-project/billingInfo"),
    ],
    ids=["serviceusage", "cloudresourcemanager", "cloudbilling"],
)  # fmt: skip
def test_apis_about_other_projects_check_the_callers_own_project(
    emu: ComputeEmulator, client: Client, service: str, title: str, path: str
) -> None:
    """Service Usage, Resource Manager and Billing need the API enabled in the caller's project (the
    service account's), not in the project asked about."""
    emu.configure_project("other-project")
    assert client.get(api(client, path)).status_code == 200
    emu.configure_project("other-project", disabled_services=[service])
    assert client.get(api(client, path)).status_code == 200  # the project asked about does not matter
    emu.configure_project(CALLER_PROJECT, disabled_services=[service])
    assert_service_disabled(client.get(api(client, path)), service, title, CALLER_PROJECT)


# -- the project, its permissions, billing -----------------------------------------------------


def test_resource_manager_gets_a_project_by_id_or_number(client: Client) -> None:
    number = project_number(PROJECT)
    by_id = client.ok(client.get(api(client, f"cloudresourcemanager/v3/projects/{PROJECT}")))
    assert by_id["name"] == f"projects/{number}" and by_id["projectId"] == PROJECT
    assert by_id["state"] == "ACTIVE" and by_id["displayName"] == PROJECT
    assert by_id["parent"].startswith("organizations/") and by_id["createTime"] and by_id["etag"]
    assert client.ok(client.get(api(client, f"cloudresourcemanager/v3/projects/{number}"))) == by_id


def test_a_missing_project_and_a_hidden_one_get_the_same_403(emu: ComputeEmulator, client: Client) -> None:
    emu.configure_project("hidden", viewers=["someone-else@other.iam.gserviceaccount.com"])
    emu.configure_project("deleted", exists=False)
    for project in ("no-such-project", "hidden", "deleted"):
        refused = client.get(api(client, f"cloudresourcemanager/v3/projects/{project}"))
        assert refused.status_code == 403
        assert refused.json() == {
            "error": {
                "code": 403,
                "message": "Permission 'resourcemanager.projects.get' denied on resource "
                f"'//cloudresourcemanager.googleapis.com/projects/{project}' (or it may not exist).",
                "status": "PERMISSION_DENIED",
                "details": [
                    {
                        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                        "reason": "IAM_PERMISSION_DENIED",
                        "domain": "cloudresourcemanager.googleapis.com",
                        "metadata": {
                            "resource": f"projects/{project}",
                            "permission": "resourcemanager.projects.get",
                        },
                    }
                ],
            }
        }
    # Compute does not serve a project that does not exist, and refuses a caller who may not see it.
    assert client.get(f"{emu.base_url}projects/deleted/zones").status_code == 404
    hidden = client.get(f"{emu.base_url}projects/hidden/zones")
    assert hidden.status_code == 403
    assert hidden.json()["error"]["message"] == (
        "Required 'compute.zones.list' permission for 'projects/hidden'"
    )


def test_test_iam_permissions_answers_the_held_subset(emu: ComputeEmulator, client: Client) -> None:
    url = api(client, f"cloudresourcemanager/v3/projects/{PROJECT}:testIamPermissions")
    wanted = ["compute.instances.create", "iap.tunnelInstances.accessViaIAP", "compute.firewalls.create"]
    assert client.ok(client.post(url, {"permissions": wanted})) == {"permissions": wanted}
    emu.configure_project(PROJECT, denied_permissions=wanted[:2])
    held = client.ok(client.post(url, {"permissions": wanted}))
    assert held == {"permissions": ["compute.firewalls.create"]}
    assert client.ok(client.post(url, {"permissions": wanted[:2]})) == {}  # none held: no key, as Google
    assert client.post(url, {"permissions": ["compute.*"]}).status_code == 400
    assert client.post(api(client, "cloudresourcemanager/v3/projects/no-such:testIamPermissions"),
                       {"permissions": wanted}).status_code == 403  # fmt: skip
    # A denied permission is denied by Compute too.
    refused = client.post(f"zones/{ZONE}/instances", small_body("vm"))
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == (
        f"Required 'compute.instances.create' permission for 'projects/{PROJECT}'"
    )


def test_search_finds_the_projects_the_caller_can_see(emu: ComputeEmulator, client: Client) -> None:
    emu.configure_project("second")
    emu.configure_project("hidden", viewers=[])
    url = api(client, "cloudresourcemanager/v3/projects:search")
    assert [p["projectId"] for p in client.ok(client.get(url))["projects"]] == [PROJECT, "second"]
    assert [p["projectId"] for p in client.ok(client.get(url, query="id:second"))["projects"]] == ["second"]
    assert client.ok(client.get(url, query="id:hidden")) == {}


def test_billing_info_and_billing_turned_off(emu: ComputeEmulator, client: Client) -> None:
    url = api(client, f"cloudbilling/v1/projects/{PROJECT}/billingInfo")
    assert client.ok(client.get(url)) == {
        "name": f"projects/{PROJECT}/billingInfo",
        "projectId": PROJECT,
        "billingAccountName": "billingAccounts/0F0F0F-1E1E1E-2D2D2D",
        "billingEnabled": True,
    }
    emu.configure_project(PROJECT, billing_enabled=False)
    off = client.ok(client.get(url))
    assert (off["billingAccountName"], off["billingEnabled"]) == ("", False)
    closed_account = "billingAccounts/000000-111111-222222"
    emu.configure_project(PROJECT, billing_enabled=False, billing_account=closed_account)
    closed = client.ok(client.get(url))  # linked to a closed account
    assert (closed["billingAccountName"], closed["billingEnabled"]) == (closed_account, False)
    refused = client.get(api(client, "cloudbilling/v1/projects/no-such-project/billingInfo"))
    assert refused.status_code == 403 and refused.json()["error"]["status"] == "PERMISSION_DENIED"


def test_a_new_project_looks_like_a_brand_new_google_project(emu: ComputeEmulator, client: Client) -> None:
    emu.new_project("fresh")
    number = project_number("fresh")
    services = ("compute", "iap", "aiplatform", "storage")
    names = [f"projects/fresh/services/{s}.googleapis.com" for s in services]
    states = client.ok(google(client, "serviceusage/v1/projects/fresh/services:batchGet", names=names))
    assert [s["state"] for s in states["services"]] == ["DISABLED", "DISABLED", "DISABLED", "ENABLED"]
    assert states["services"][0]["name"] == f"projects/{number}/services/compute.googleapis.com"
    assert_service_disabled(client.get(f"{emu.base_url}projects/fresh/regions/{REGION}"),
                            "compute.googleapis.com", "Compute Engine API", "fresh")  # fmt: skip
    wanted = {"permissions": ["iap.tunnelInstances.accessViaIAP", "compute.instances.create"]}
    url = api(client, "cloudresourcemanager/v3/projects/fresh:testIamPermissions")
    tested = client.ok(client.post(url, wanted))
    assert tested == {"permissions": ["compute.instances.create"]}
    assert client.ok(client.get(api(client, "cloudbilling/v1/projects/fresh/billingInfo")))["billingEnabled"]

    emu.configure_project("fresh", disabled_services=[])  # once Compute is enabled: no GPU quota
    quotas = region_quotas(client, "fresh")
    assert quotas["NVIDIA_L4_GPUS"][0] == quotas["PREEMPTIBLE_NVIDIA_L4_GPUS"][0] == 0
    assert quotas["CPUS"][0] > 0 and quotas["NVIDIA_T4_GPUS"][0] > 0
    assert quotas_of(client.ok(client.get(f"{emu.base_url}projects/fresh")))["GPUS_ALL_REGIONS"][0] == 0
    inserted = client.ok(client.post(f"{emu.base_url}projects/fresh/zones/{ZONE}/instances", l4_body("gpu")))
    op = client.wait(inserted)
    assert op["error"]["errors"][0]["message"] == "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."


# -- the control path, the state file ----------------------------------------------------------


def test_settings_over_http_for_a_sandbox_of_another_process(emu: ComputeEmulator, client: Client) -> None:
    control = requests.Session()  # not a Google API: no credential
    url = f"{emu.url}/emulator/v1/projects/drill"
    keywords = {"new": True, "quotas": {"us-east1/NVIDIA_L4_GPUS": 2}, "billing_enabled": False}
    answer = control.put(url, json=keywords, timeout=10)
    assert answer.status_code == 200, answer.text
    settings = answer.json()
    assert settings["number"] == project_number("drill") and settings["billing_enabled"] is False
    assert settings["quotas"] == {"*/NVIDIA_L4_GPUS": 0.0, "*/PREEMPTIBLE_NVIDIA_L4_GPUS": 0.0,
                                  "global/GPUS_ALL_REGIONS": 0.0, "us-east1/NVIDIA_L4_GPUS": 2.0}  # fmt: skip
    assert "compute.googleapis.com" in settings["disabled_services"]
    assert control.get(url, timeout=10).json() == settings
    assert client.ok(google(client, "cloudbilling/v1/projects/drill/billingInfo"))["billingEnabled"] is False
    bad_settings = [{"quotas": {"us-east1/NOPE": 1}}, {"no_such_knob": 1}, {"exists": "yes"}, [1],
                    {"new": True, "viewers": 7}]  # fmt: skip
    for bad in bad_settings:
        refused = control.put(url, json=bad, timeout=10)
        assert refused.status_code == 400, bad
    assert control.get(url, timeout=10).json() == settings


def test_project_settings_persist_in_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "compute.json"
    with ComputeEmulator(state_file=state) as emu:
        emu.configure_project(PROJECT, quotas={(REGION, "NVIDIA_L4_GPUS"): 0}, billing_enabled=False,
                              denied_permissions=["compute.instances.create"])  # fmt: skip
        emu.new_project("fresh")
        emu.seed_instances("gone", ZONE, 1)
        emu.configure_project("gone", exists=False)
        emu.configure_project("gone", billing_enabled=False)  # None keeps it gone
        before = {p: emu.project_settings(p) for p in (PROJECT, "fresh", "gone")}
    assert "project_settings" in json.loads(state.read_text())
    with ComputeEmulator(state_file=state) as again:
        assert {p: again.project_settings(p) for p in (PROJECT, "fresh", "gone")} == before
        assert "gone" not in again.projects and "fresh" in again.projects


# -- against Google's discovery documents ------------------------------------------------------


def _document(name: str) -> dict[str, Any]:
    return json.loads((DOCUMENTS / name).read_text())


def _method(document: dict[str, Any], *path: str) -> dict[str, Any]:
    node: dict[str, Any] = document
    for resource in path[:-1]:
        node = node["resources"][resource]
    return node["methods"][path[-1]]


def _keys_in_schema(document: dict[str, Any], schema: str, value: Any) -> None:
    """Every key of `value` is a property of `schema` (recursing through $refs and arrays)."""
    properties = document["schemas"][schema]["properties"]
    assert set(value) <= set(properties), (schema, set(value) - set(properties))
    for key, item in value.items():
        spec = properties[key]
        ref = spec.get("$ref") or spec.get("items", {}).get("$ref")
        if ref and isinstance(item, dict):
            _keys_in_schema(document, ref, item)
        elif ref and isinstance(item, list):
            for element in item:
                _keys_in_schema(document, ref, element)
        if "enum" in spec and isinstance(item, str):
            assert item in spec["enum"], (schema, key, item)


def test_routes_and_answers_follow_googles_discovery_documents(emu: ComputeEmulator, client: Client) -> None:
    """Each served path is the document's flatPath under the API's prefix, and every answer holds
    only the fields (and enum values) of the response schema the document names."""
    number = project_number(PROJECT)
    compute = _document("compute.v1.json")
    region_get = _method(compute, "regions", "get")
    assert region_get["flatPath"] == "projects/{project}/regions/{region}"
    assert _method(compute, "regions", "list")["flatPath"] == "projects/{project}/regions"
    client.insert(l4_body("vm"))
    region = client.ok(client.get(f"regions/{REGION}"))
    _keys_in_schema(compute, region_get["response"]["$ref"], region)
    _keys_in_schema(compute, "Project", client.ok(client.get(f"{emu.base_url}projects/{PROJECT}")))
    metrics = set(compute["schemas"]["Quota"]["properties"]["metric"]["enum"])
    assert {q["metric"] for q in region["quotas"]} <= metrics

    calls = [
        ("serviceusage.v1.json", ("services", "get"), "serviceusage/v1/",
         {"name": f"projects/{PROJECT}/services/compute.googleapis.com"}, None),
        ("serviceusage.v1.json", ("services", "batchGet"), "serviceusage/v1/",
         {"parent": f"projects/{PROJECT}"}, None),
        ("cloudresourcemanager.v3.json", ("projects", "get"), "cloudresourcemanager/v3/",
         {"name": f"projects/{PROJECT}"}, None),
        ("cloudresourcemanager.v3.json", ("projects", "testIamPermissions"), "cloudresourcemanager/v3/",
         {"resource": f"projects/{PROJECT}"}, {"permissions": ["compute.instances.create"]}),
        ("cloudresourcemanager.v3.json", ("projects", "search"), "cloudresourcemanager/v3/", {}, None),
        ("cloudbilling.v1.json", ("projects", "getBillingInfo"), "cloudbilling/v1/",
         {"name": f"projects/{PROJECT}"}, None),
    ]  # fmt: skip
    for document_name, method_path, prefix, params, body in calls:
        document = _document(document_name)
        method = _method(document, *method_path)
        path = method["path"]  # "v1/{+name}": expand the reserved parameters as a client does
        for key, value in params.items():
            path = path.replace("{+" + key + "}", value)
        assert "{" not in path and path.startswith(prefix.split("/")[1] + "/")
        url = f"{emu.url}/{prefix.split('/')[0]}/{path}"
        query = {"names": [f"projects/{number}/services/iap.googleapis.com"]} if "batchGet" in path else {}
        response = client.session.request(method["httpMethod"], url, params=query, json=body, timeout=10)
        assert response.status_code == 200, (url, response.text)
        _keys_in_schema(document, method["response"]["$ref"], response.json())
