"""Google's own Compute clients drive a whole instance lifecycle against the emulator over real HTTP.

Two clients nobody here wrote, each with its default settings apart from the endpoint and the
sandbox's service-account key file:

- `google-cloud-compute` (REST transport): authenticates with a self-signed JWT (AIP-4111), never
  calling the token endpoint, and builds its request bodies from its own proto types;
- the discovery client (google-api-python-client): exchanges a JWT-bearer grant for an OAuth
  access token at the key file's `token_uri`.

The calls a preflight check makes (Compute quotas, Service Usage, Resource Manager v3, Cloud
Billing) are driven the same two ways, each API's client pointed at the emulator's origin plus the
API's prefix (`/cloudresourcemanager`, ...), with the emulator's knobs making each answer fail.

Both clients' google-auth starts its background Regional Access Boundary lookup
(iamcredentials.googleapis.com) after a refresh; the conftest guard refuses it, and these tests
check that it is the only thing that tried to leave the machine (see test_client_http.py).
google-cloud-compute's `ExtendedOperation.result()` polls through an operations client that
ignores `api_endpoint` (it would call compute.googleapis.com), so the tests wait with a
`ZoneOperationsClient` built with the same options, as any caller of a custom endpoint must.
"""

from __future__ import annotations

import json
from pathlib import Path

import google.api_core.exceptions
import pytest
import yaml
from gcp_helpers import REPO
from google.cloud import billing_v1, compute_v1, resourcemanager_v3, service_usage_v1
from google.oauth2 import service_account
from googleapiclient import discovery
from googleapiclient.errors import HttpError

PROJECT = "forja-sandbox"
# forja's VM: the gcp_instance role's defaults (zone, machine type, image, boot disk).
VM = yaml.safe_load((REPO / "roles/gcp_instance/defaults/main.yml").read_text())
ZONE = VM["gcp_instance_zone"]
# google-auth's own lookup may run in the background; anything else that leaves the machine fails.
pytestmark = pytest.mark.usefixtures("only_googles_background_lookup_left_the_machine")




@pytest.fixture
def slow_operations(emulator):
    """Operations go PENDING -> RUNNING -> DONE over a few polls, as on GCE."""
    emulator.operation_delay_s = 0.05
    return emulator


def l4_instance(name: str) -> compute_v1.Instance:
    """forja's training VM as the gcp_instance role creates it by default, in the client's own types."""
    image = (
        f"projects/{VM['gcp_instance_image_project']}/global/images/family/{VM['gcp_instance_image_family']}"
    )
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{ZONE}/machineTypes/{VM['gcp_instance_machine_type']}",
        scheduling=compute_v1.Scheduling(
            on_host_maintenance="TERMINATE", automatic_restart=True, provisioning_model="STANDARD"
        ),
        disks=[
            compute_v1.AttachedDisk(
                boot=True,
                auto_delete=True,
                type_="PERSISTENT",
                interface=VM["gcp_instance_boot_disk_interface"],
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=image,
                    disk_size_gb=VM["gcp_instance_boot_disk_size_gb"],
                    disk_type=f"zones/{ZONE}/diskTypes/{VM['gcp_instance_boot_disk_type']}",
                ),
            )
        ],
        network_interfaces=[
            compute_v1.NetworkInterface(
                network=f"global/networks/{VM['gcp_instance_network']}",
                access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")],
            )
        ],
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="install-nvidia-driver", value="True")]),
        labels={"managed-by": "forja"},
    )


class GoogleCloudCompute:
    """The library's clients for instances and zone operations, on the emulator's endpoint."""

    def __init__(self, emulator, credentials) -> None:
        options = {"api_endpoint": emulator.url}
        self.instances = compute_v1.InstancesClient(
            credentials=credentials, transport="rest", client_options=options
        )
        self.operations = compute_v1.ZoneOperationsClient(
            credentials=credentials, transport="rest", client_options=options
        )

    def wait(self, operation) -> compute_v1.Operation:
        """zoneOperations.wait until DONE; an operation that ended in an error fails the test."""
        for _ in range(50):
            done = self.operations.wait(project=PROJECT, zone=ZONE, operation=operation.name)
            if done.status == compute_v1.Operation.Status.DONE:
                assert not done.error.errors, done.error
                return done
        raise AssertionError(f"operation {operation.name} never finished")

    def get(self, name: str) -> compute_v1.Instance:
        return self.instances.get(project=PROJECT, zone=ZONE, instance=name)


def test_google_cloud_compute_drives_the_whole_lifecycle(slow_operations, key_file: Path) -> None:
    emulator = slow_operations
    gcc = GoogleCloudCompute(emulator, service_account.Credentials.from_service_account_file(str(key_file)))

    insert = gcc.instances.insert(project=PROJECT, zone=ZONE, instance_resource=l4_instance("gcc-vm"))
    assert insert.status != compute_v1.Operation.Status.DONE  # answered at once, still to run
    done = gcc.wait(insert)
    assert done.operation_type == "insert" and done.target_link.endswith("/instances/gcc-vm")
    vm = gcc.get("gcc-vm")
    assert vm.status == "RUNNING"
    assert vm.machine_type.endswith(f"/zones/{ZONE}/machineTypes/{VM['gcp_instance_machine_type']}")
    assert vm.disks[0].disk_size_gb == VM["gcp_instance_boot_disk_size_gb"] and vm.disks[0].boot
    assert [(a.accelerator_type.rsplit("/", 1)[-1], a.accelerator_count) for a in vm.guest_accelerators] == [
        ("nvidia-l4", 1)
    ]
    assert vm.network_interfaces[0].access_configs[0].nat_i_p
    assert [i.name for i in gcc.instances.list(project=PROJECT, zone=ZONE)] == ["gcc-vm"]
    by_zone = {zone: scoped for zone, scoped in gcc.instances.aggregated_list(project=PROJECT)}
    assert [i.name for i in by_zone[f"zones/{ZONE}"].instances] == ["gcc-vm"]
    assert by_zone["zones/us-east1-b"].warning.code == "NO_RESULTS_ON_PAGE"

    labels = compute_v1.InstancesSetLabelsRequest(
        labels={**vm.labels, "team": "ml"}, label_fingerprint=vm.label_fingerprint
    )
    gcc.wait(
        gcc.instances.set_labels(
            project=PROJECT, zone=ZONE, instance="gcc-vm", instances_set_labels_request_resource=labels
        )
    )
    metadata = compute_v1.Metadata(
        fingerprint=vm.metadata.fingerprint,
        items=[*vm.metadata.items, compute_v1.Items(key="enable-oslogin", value="TRUE")],
    )
    gcc.wait(
        gcc.instances.set_metadata(project=PROJECT, zone=ZONE, instance="gcc-vm", metadata_resource=metadata)
    )
    vm = gcc.get("gcc-vm")
    assert dict(vm.labels) == {"managed-by": "forja", "team": "ml"}
    assert {i.key: i.value for i in vm.metadata.items}["enable-oslogin"] == "TRUE"

    gcc.wait(gcc.instances.stop(project=PROJECT, zone=ZONE, instance="gcc-vm"))
    stopped = gcc.get("gcc-vm")
    assert stopped.status == "TERMINATED" and stopped.last_stop_timestamp
    assert not stopped.network_interfaces[0].access_configs[0].nat_i_p  # ephemeral IP released
    gcc.wait(gcc.instances.start(project=PROJECT, zone=ZONE, instance="gcc-vm"))
    assert gcc.get("gcc-vm").status == "RUNNING"

    delete = gcc.instances.delete(project=PROJECT, zone=ZONE, instance="gcc-vm")
    gcc.wait(delete)
    with pytest.raises(google.api_core.exceptions.NotFound):
        gcc.get("gcc-vm")
    kinds = [op.operation_type for op in gcc.operations.list(project=PROJECT, zone=ZONE)]
    assert sorted(kinds) == sorted(["insert", "setLabels", "setMetadata", "stop", "start", "delete"])
    # Self-signed JWTs all the way: the token endpoint was never called.
    assert emulator.stats["token_requests"] == 0
    assert emulator.instances(PROJECT) == []


def test_google_cloud_compute_with_scoped_credentials_sends_a_scoped_jwt(emulator, key_file: Path) -> None:
    """Credentials with scopes make the client's JWT carry `scope` instead of `aud` (AIP-4111)."""
    emulator.seed_instances(PROJECT, ZONE, 2)
    credentials = service_account.Credentials.from_service_account_file(
        str(key_file), scopes=["https://www.googleapis.com/auth/compute"]
    )
    gcc = GoogleCloudCompute(emulator, credentials)
    assert sorted(i.name for i in gcc.instances.list(project=PROJECT, zone=ZONE)) == ["seed-0", "seed-1"]
    assert emulator.stats["token_requests"] == 0


def test_google_cloud_compute_pages_and_reads_googles_errors(emulator, key_file: Path) -> None:
    """Its pagers follow nextPageToken; its exceptions and operation fields come from our error shapes."""
    emulator.seed_instances(PROJECT, ZONE, 5)
    emulator.seed_instances(PROJECT, "us-central1-a", 3, name_prefix="central")
    gcc = GoogleCloudCompute(emulator, service_account.Credentials.from_service_account_file(str(key_file)))
    pager = gcc.instances.list(request={"project": PROJECT, "zone": ZONE, "max_results": 2})
    assert [len(page.items) for page in pager.pages] == [2, 2, 1]
    aggregated = gcc.instances.aggregated_list(request={"project": PROJECT, "max_results": 3})
    assert sorted(i.name for _zone, scoped in aggregated for i in scoped.instances) == sorted(
        [f"seed-{n}" for n in range(5)] + [f"central-{n}" for n in range(3)]
    )

    emulator.faults.add("instances.insert", error="ZONE_RESOURCE_POOL_EXHAUSTED", zone=ZONE)
    failed = gcc.operations.wait(
        project=PROJECT,
        zone=ZONE,
        operation=gcc.instances.insert(
            project=PROJECT, zone=ZONE, instance_resource=l4_instance("no-room")
        ).name,
    )
    assert failed.status == compute_v1.Operation.Status.DONE
    assert (failed.http_error_status_code, failed.error.errors[0].code) == (
        503,
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    )
    with pytest.raises(google.api_core.exceptions.Conflict):
        gcc.instances.insert(project=PROJECT, zone=ZONE, instance_resource=l4_instance("seed-0"))
    stale = compute_v1.InstancesSetLabelsRequest(labels={"a": "b"}, label_fingerprint="AAAAAAAAAAA=")
    with pytest.raises(google.api_core.exceptions.PreconditionFailed):
        gcc.instances.set_labels(
            project=PROJECT, zone=ZONE, instance="seed-0", instances_set_labels_request_resource=stale
        )
    with pytest.raises(google.api_core.exceptions.BadRequest, match="provisioningModel"):
        bad = l4_instance("bad-spot")
        bad.scheduling.provisioning_model = "SPOTT"
        gcc.instances.insert(project=PROJECT, zone=ZONE, instance_resource=bad)


def test_google_cloud_compute_signed_by_an_unknown_key_gets_googles_401(emulator, tmp_path: Path) -> None:
    from forja_sandbox.compute_emulator import ComputeEmulator

    genuine = json.loads(emulator.write_service_account_key(tmp_path / "sa.json").read_text())
    with ComputeEmulator() as other:  # another emulator: a private key this one never saw
        forged = json.loads(other.write_service_account_key(tmp_path / "other.json").read_text())
    forged.update(client_email=genuine["client_email"], private_key_id=genuine["private_key_id"])
    gcc = GoogleCloudCompute(emulator, service_account.Credentials.from_service_account_info(forged))
    with pytest.raises(google.api_core.exceptions.Unauthorized) as refused:
        gcc.get("anything")
    error = refused.value.response.json()["error"]
    assert error["code"] == 401 and error["status"] == "UNAUTHENTICATED"
    assert error["message"].startswith("Request had invalid authentication credentials.")
    assert error["errors"] == [
        {
            "message": "Invalid Credentials",
            "domain": "global",
            "reason": "authError",
            "location": "Authorization",
            "locationType": "header",
        }
    ]
    assert 'error="invalid_token"' in refused.value.response.headers["WWW-Authenticate"]


def test_the_discovery_client_drives_the_whole_lifecycle(slow_operations, key_file: Path) -> None:
    emulator = slow_operations
    credentials = service_account.Credentials.from_service_account_file(str(key_file))
    compute = discovery.build(
        "compute", "v1", credentials=credentials, client_options={"api_endpoint": emulator.base_url}
    )

    def wait(operation: dict) -> dict:
        for _ in range(50):
            operation = (
                compute.zoneOperations()
                .wait(project=PROJECT, zone=ZONE, operation=operation["name"])
                .execute()
            )
            if operation["status"] == "DONE":
                assert "error" not in operation, operation
                return operation
        raise AssertionError(f"operation {operation['name']} never finished")

    instances = compute.instances()
    body = json.loads(compute_v1.Instance.to_json(l4_instance("disco-vm")))
    insert = instances.insert(project=PROJECT, zone=ZONE, body=body).execute()
    assert insert["status"] == "PENDING"
    wait(insert)
    vm = instances.get(project=PROJECT, zone=ZONE, instance="disco-vm").execute()
    assert vm["status"] == "RUNNING" and vm["disks"][0]["diskSizeGb"] == str(
        VM["gcp_instance_boot_disk_size_gb"]
    )
    listed = instances.list(project=PROJECT, zone=ZONE).execute()
    assert [i["name"] for i in listed["items"]] == ["disco-vm"]
    aggregated = instances.aggregatedList(project=PROJECT, filter="labels.managed-by=forja").execute()
    assert [i["name"] for i in aggregated["items"][f"zones/{ZONE}"]["instances"]] == ["disco-vm"]

    labels = {"labels": {**vm["labels"], "team": "ml"}, "labelFingerprint": vm["labelFingerprint"]}
    wait(instances.setLabels(project=PROJECT, zone=ZONE, instance="disco-vm", body=labels).execute())
    stale = instances.setLabels(project=PROJECT, zone=ZONE, instance="disco-vm", body=labels)
    with pytest.raises(HttpError) as conflict:
        stale.execute()
    assert conflict.value.status_code == 412  # the fingerprint moved on
    metadata = dict(vm["metadata"])
    metadata["items"] = [*metadata["items"], {"key": "enable-oslogin", "value": "TRUE"}]
    wait(instances.setMetadata(project=PROJECT, zone=ZONE, instance="disco-vm", body=metadata).execute())

    wait(instances.stop(project=PROJECT, zone=ZONE, instance="disco-vm").execute())
    assert instances.get(project=PROJECT, zone=ZONE, instance="disco-vm").execute()["status"] == "TERMINATED"
    wait(instances.start(project=PROJECT, zone=ZONE, instance="disco-vm").execute())
    vm = instances.get(project=PROJECT, zone=ZONE, instance="disco-vm").execute()
    assert vm["status"] == "RUNNING" and vm["labels"]["team"] == "ml"
    assert {i["key"]: i["value"] for i in vm["metadata"]["items"]}["enable-oslogin"] == "TRUE"

    wait(instances.delete(project=PROJECT, zone=ZONE, instance="disco-vm").execute())
    with pytest.raises(HttpError) as gone:
        instances.get(project=PROJECT, zone=ZONE, instance="disco-vm").execute()
    assert gone.value.status_code == 404
    # The OAuth flow: one JWT-bearer grant, then its access token for every call.
    assert emulator.stats["token_requests"] == 1


# -- what a preflight check asks (quotas, API enablement, the project, billing) -------------------


class PreflightClients:
    """Google's own clients of the APIs a preflight check calls, on the emulator's origin."""

    def __init__(self, emulator, credentials) -> None:
        def options(prefix: str = "") -> dict[str, str]:
            return {"api_endpoint": emulator.url + prefix}

        rest = {"credentials": credentials, "transport": "rest"}
        self.regions = compute_v1.RegionsClient(**rest, client_options=options())
        self.projects = compute_v1.ProjectsClient(**rest, client_options=options())
        self.resource_manager = resourcemanager_v3.ProjectsClient(
            **rest, client_options=options("/cloudresourcemanager")
        )
        self.service_usage = service_usage_v1.ServiceUsageClient(
            **rest, client_options=options("/serviceusage")
        )
        self.billing = billing_v1.CloudBillingClient(**rest, client_options=options("/cloudbilling"))

    def region_quotas(self, project: str = PROJECT, region: str = "us-east1") -> dict[str, tuple]:
        region_resource = self.regions.get(project=project, region=region)
        return {q.metric: (q.limit, q.usage) for q in region_resource.quotas}

    def state(self, project: str, service: str) -> str:
        name = f"projects/{project}/services/{service}"
        return service_usage_v1.State(self.service_usage.get_service(request={"name": name}).state).name


def last_path(emulator, api: str) -> str:
    """The path (after the API's prefix) of the newest request to a non-Compute API."""
    return [path for method, path, _q, _b in emulator.requests if method.startswith(api)][-1]


def test_googles_clients_read_the_preflight_answers(emulator, key_file: Path) -> None:
    clients = PreflightClients(emulator, service_account.Credentials.from_service_account_file(str(key_file)))
    emulator.seed_instances(PROJECT, ZONE, 1, "l4", machine_type="g2-standard-8")

    quotas = clients.region_quotas()
    assert quotas["NVIDIA_L4_GPUS"] == (16, 1) and quotas["CPUS"] == (24000, 8)
    assert {"PREEMPTIBLE_NVIDIA_L4_GPUS", "NVIDIA_T4_GPUS", "SSD_TOTAL_GB", "IN_USE_ADDRESSES"} <= set(quotas)
    project_quotas = {q.metric: (q.limit, q.usage) for q in clients.projects.get(project=PROJECT).quotas}
    assert project_quotas["GPUS_ALL_REGIONS"] == (32, 1)

    project = clients.resource_manager.get_project(name=f"projects/{PROJECT}")
    assert last_path(emulator, "cloudresourcemanager/v3") == f"projects/{PROJECT}"  # the URL it built
    assert project.project_id == PROJECT and project.state == resourcemanager_v3.Project.State.ACTIVE
    assert project.name == f"projects/{emulator.project_settings(PROJECT)['number']}"
    wanted = ["compute.instances.create", "iap.tunnelInstances.accessViaIAP"]
    held = clients.resource_manager.test_iam_permissions(resource=f"projects/{PROJECT}", permissions=wanted)
    assert last_path(emulator, "cloudresourcemanager/v3") == f"projects/{PROJECT}:testIamPermissions"
    assert list(held.permissions) == wanted
    found = clients.resource_manager.search_projects(query=f"id:{PROJECT}")
    assert [p.project_id for p in found] == [PROJECT]
    assert last_path(emulator, "cloudresourcemanager/v3") == "projects:search"

    assert clients.state(PROJECT, "compute.googleapis.com") == "ENABLED"
    names = [f"projects/{PROJECT}/services/{s}.googleapis.com" for s in ("iap", "storage")]
    request = {"parent": f"projects/{PROJECT}", "names": names}
    batch = clients.service_usage.batch_get_services(request=request)
    assert last_path(emulator, "serviceusage/v1") == f"projects/{PROJECT}/services:batchGet"
    assert [(s.config.title, s.state.name) for s in batch.services] == [
        ("Cloud Identity-Aware Proxy API", "ENABLED"), ("Cloud Storage API", "ENABLED")
    ]  # fmt: skip

    billing = clients.billing.get_project_billing_info(name=f"projects/{PROJECT}")
    assert last_path(emulator, "cloudbilling/v1") == f"projects/{PROJECT}/billingInfo"
    assert billing.billing_enabled and billing.billing_account_name.startswith("billingAccounts/")
    assert emulator.stats["token_requests"] == 0  # self-signed JWTs, one audience per API


def test_googles_clients_see_each_knob_fail_its_check(emulator, key_file: Path) -> None:
    clients = PreflightClients(emulator, service_account.Credentials.from_service_account_file(str(key_file)))
    emulator.new_project("fresh")
    number = emulator.project_settings("fresh")["number"]

    with pytest.raises(google.api_core.exceptions.Forbidden) as disabled:  # API disabled
        clients.regions.get(project="fresh", region="us-east1")
    assert disabled.value.reason == "SERVICE_DISABLED" and disabled.value.domain == "googleapis.com"
    assert disabled.value.metadata["activationUrl"] == (
        f"https://console.developers.google.com/apis/api/compute.googleapis.com/overview?project={number}"
    )
    assert disabled.value.metadata["consumer"] == f"projects/{number}"
    assert [clients.state("fresh", s) for s in ("compute.googleapis.com", "iap.googleapis.com",
                                                "aiplatform.googleapis.com")] == ["DISABLED"] * 3  # fmt: skip

    emulator.configure_project("fresh", disabled_services=[])  # quota 0
    quotas = clients.region_quotas("fresh")
    assert quotas["NVIDIA_L4_GPUS"][0] == quotas["PREEMPTIBLE_NVIDIA_L4_GPUS"][0] == 0
    assert {q.metric: q.limit for q in clients.projects.get(project="fresh").quotas}["GPUS_ALL_REGIONS"] == 0

    held = clients.resource_manager.test_iam_permissions(  # permission missing
        resource="projects/fresh", permissions=["iap.tunnelInstances.accessViaIAP"]
    )
    assert list(held.permissions) == []

    with pytest.raises(google.api_core.exceptions.Forbidden) as missing:  # project missing
        clients.resource_manager.get_project(name="projects/no-such-project")
    assert missing.value.reason == "IAM_PERMISSION_DENIED"
    assert "(or it may not exist)" in missing.value.message

    emulator.configure_project("fresh", billing_enabled=False)  # billing off
    billing = clients.billing.get_project_billing_info(name="projects/fresh")
    assert (billing.billing_enabled, billing.billing_account_name) == (False, "")


def test_the_discovery_client_reads_the_preflight_apis(emulator, key_file: Path) -> None:
    """google-api-python-client's static documents for Service Usage, Resource Manager v3 and Cloud
    Billing, each pointed at the API's prefix, with OAuth access tokens."""
    credentials = service_account.Credentials.from_service_account_file(str(key_file))

    def build(name: str, version: str):
        return discovery.build(name, version, credentials=credentials, static_discovery=True,
                               client_options={"api_endpoint": f"{emulator.url}/{name}/"})  # fmt: skip

    emulator.configure_project(PROJECT, disabled_services=["iap.googleapis.com"])
    services = build("serviceusage", "v1").services()
    iap = services.get(name=f"projects/{PROJECT}/services/iap.googleapis.com").execute()
    assert iap["state"] == "DISABLED"
    names = [f"projects/{PROJECT}/services/compute.googleapis.com"]
    batch = services.batchGet(parent=f"projects/{PROJECT}", names=names).execute()
    assert [s["state"] for s in batch["services"]] == ["ENABLED"]

    projects = build("cloudresourcemanager", "v3").projects()
    assert projects.get(name=f"projects/{PROJECT}").execute()["projectId"] == PROJECT
    wanted = {"permissions": ["compute.instances.create"]}
    tested = projects.testIamPermissions(resource=f"projects/{PROJECT}", body=wanted).execute()
    assert tested == {"permissions": ["compute.instances.create"]}
    found = projects.search(query=f"id:{PROJECT}").execute()
    assert [p["projectId"] for p in found["projects"]] == [PROJECT]
    with pytest.raises(HttpError) as hidden:
        projects.get(name="projects/no-such-project").execute()
    assert hidden.value.status_code == 403

    billing = build("cloudbilling", "v1").projects().getBillingInfo(name=f"projects/{PROJECT}").execute()
    assert billing["billingEnabled"] is True and billing["projectId"] == PROJECT
    assert emulator.stats["token_requests"] == 3  # OAuth access tokens: one grant per built client
