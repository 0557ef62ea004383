# Copyright: forja contributors
# Apache-2.0
"""Vertex AI custom jobs over the aiplatform v1 REST API, through forja's one GCP client.

Auth, the HTTP session, timeouts and error wording are forja_gcp.GcpClient's (the one place forja
talks to Google APIs); this file adds what is Vertex's own: the regional endpoint, the CustomJob
body built from the module's options, and the job's states. Creating a job is one POST, never
retried: CreateCustomJob has no request id, so a retried POST could start a second job.
Machine and accelerator are checked against forja's one machine catalog before any call.
"""

from __future__ import annotations

import re
import time
from typing import Any

try:  # in Ansible (AnsiballZ) by FQCN; forja's controller loads the siblings by path (forja/module_utils.py)
    from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
        NETWORK_ERRORS,
        GcpApiError,
        GcpClient,
        GcpError,
    )
    from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import (
        MachineSpecError,
        resolve_gpus,
    )
except ImportError:
    from forja_gcp import NETWORK_ERRORS, GcpApiError, GcpClient, GcpError  # type: ignore[no-redef]
    from forja_gcp_machines import MachineSpecError, resolve_gpus  # type: ignore[no-redef]

#: Vertex is regional: each region has its own endpoint.
DEFAULT_API_URL = "https://{region}-aiplatform.googleapis.com/v1/"
ENV_API_URL = "FORJA_VERTEX_API_URL"
#: Cloud Logging, where Vertex writes each replica's stdout and stderr (monitored resource ml_job).
DEFAULT_LOGGING_URL = "https://logging.googleapis.com/v2/"
ENV_LOGGING_URL = "FORJA_LOGGING_API_URL"
#: entries:list's largest page (Cloud Logging refuses more).
LOG_PAGE_SIZE = 1000
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
RUNNING_STATES = ("JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_UPDATING")
FINAL_STATES = (
    "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED",
    "JOB_STATE_PARTIALLY_SUCCEEDED",
)  # fmt: skip
#: A job of this display name in one of these states is the one ``state: present`` asks for.
PRESENT_STATES = (*RUNNING_STATES, "JOB_STATE_SUCCEEDED")


class VertexSpecError(ValueError):
    """A worker pool that cannot work; the message names the option and the fix."""


#: A container image reference, [HOST/]PATH[:TAG][@sha256:DIGEST] (the Docker reference grammar):
#: the first part is a registry host when it has a dot or a port (or is localhost), else the name is
#: Docker Hub's; the repository path is lower case, as both Google registries require.
_IMAGE_URI = re.compile(
    r"^((?P<host>([a-z0-9-]+\.)+[a-z0-9-]+(:[0-9]+)?|[a-z0-9.-]+:[0-9]+|localhost)/)?"
    r"(?P<path>[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*)"
    r"(:(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(@sha256:(?P<digest>[0-9a-f]{64}))?$"
)
IMAGE_EXAMPLE = "us-central1-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE:TAG"


def check_image_uri(uri: str, field: str) -> None:
    """Refuse an image Vertex AI cannot pull, before anything is sent: the reference's form, and
    its registry, which must be Artifact Registry (``REGION-docker.pkg.dev/PROJECT/REPO/IMAGE``) or
    Container Registry (``gcr.io``, ``us.gcr.io`` ... ``/PROJECT/IMAGE``): Vertex's custom training
    pulls from those two only (Docker Hub and other registries fail at the pull, after queueing)."""
    found = _IMAGE_URI.match(uri or "")
    if not found:
        raise VertexSpecError(
            f"{field}: {uri!r} is not an image reference; give HOST/PATH[:TAG] or HOST/PATH@sha256:DIGEST, "
            f"e.g. {IMAGE_EXAMPLE}"
        )
    host, parts = found["host"] or "docker.io", found["path"].split("/")
    if host.endswith("-docker.pkg.dev"):
        if len(parts) < 3:
            raise VertexSpecError(
                f"{field}: {uri!r}: an Artifact Registry image is {host}/PROJECT/REPOSITORY/IMAGE, "
                f"e.g. {IMAGE_EXAMPLE}"
            )
    elif host == "gcr.io" or host.endswith(".gcr.io"):
        if len(parts) < 2:
            raise VertexSpecError(f"{field}: {uri!r}: a Container Registry image is {host}/PROJECT/IMAGE")
    else:
        raise VertexSpecError(
            f"{field}: {uri!r} is in the registry {host}, which Vertex AI cannot pull from; push the "
            f"image to Artifact Registry (e.g. {IMAGE_EXAMPLE}) or Container Registry (gcr.io/PROJECT/IMAGE)"
        )


def api_url(region: str, given: str | None, env: dict[str, str]) -> str:
    url = given or env.get(ENV_API_URL) or DEFAULT_API_URL.format(region=region)
    return url if url.endswith("/") else url + "/"


def logging_url(given: str | None, env: dict[str, str]) -> str:
    url = given or env.get(ENV_LOGGING_URL) or DEFAULT_LOGGING_URL
    return url if url.endswith("/") else url + "/"


def to_compute_name(accelerator: str) -> str:
    """Vertex's ``NVIDIA_TESLA_T4`` is Compute Engine's (and the catalog's) ``nvidia-tesla-t4``."""
    return accelerator.lower().replace("_", "-")


def worker_pool(pool: dict[str, Any], index: int, env: dict[str, str]) -> dict[str, Any]:
    """One module worker pool -> one WorkerPoolSpec (REST JSON), checked before any call."""
    where = f"worker_pools[{index}]"
    accelerator = pool.get("accelerator_type")
    count = pool.get("accelerator_count") or 0
    if bool(accelerator) != bool(count):
        raise VertexSpecError(
            f"{where}.accelerator_type: give accelerator_type and accelerator_count together (e.g. "
            "NVIDIA_L4 and 1), or neither for a CPU-only pool"
        )
    try:
        resolve_gpus(
            pool["machine_type"], to_compute_name(accelerator) if accelerator else None, count or None
        )
    except MachineSpecError as exc:
        named, _sep, why = str(exc).partition(": ")
        field = {"gpu_type": "accelerator_type", "gpu_count": "accelerator_count"}.get(named, named)
        why = why.replace("gpu_type", "accelerator_type").replace("gpu_count", "accelerator_count")
        raise VertexSpecError(f"{where}.{field}: {why}") from None
    package, container = pool.get("python_package"), pool.get("container")
    if bool(package) == bool(container):
        raise VertexSpecError(f"{where}: give exactly one of python_package or container")
    machine: dict[str, Any] = {"machineType": pool["machine_type"]}
    if accelerator:
        machine.update(acceleratorType=accelerator, acceleratorCount=count)
    spec: dict[str, Any] = {"machineSpec": machine, "replicaCount": pool.get("replica_count") or 1}
    if pool.get("boot_disk_size_gb"):
        spec["diskSpec"] = {"bootDiskType": "pd-ssd", "bootDiskSizeGb": pool["boot_disk_size_gb"]}
    variables = [{"name": k, "value": str(v)} for k, v in sorted({**env, **(pool.get("env") or {})}.items())]
    if package:
        spec["pythonPackageSpec"] = {
            "executorImageUri": package["executor_image_uri"],
            "packageUris": list(package["package_uris"]),
            "pythonModule": package["python_module"],
            "args": list(package.get("args") or []),
            "env": variables,
        }
    else:
        check_image_uri(container["image_uri"], f"{where}.container.image_uri")
        spec["containerSpec"] = {
            "imageUri": container["image_uri"],
            "command": list(container.get("command") or []),
            "args": list(container.get("args") or []),
            "env": variables,
        }
    return spec


def custom_job(params: dict[str, Any]) -> dict[str, Any]:
    """The CustomJob body (REST JSON) the module's options describe."""
    pools = params.get("worker_pools") or []
    if not pools:
        raise VertexSpecError("worker_pools: give at least one pool (the first is the primary replica)")
    if (pools[0].get("replica_count") or 1) != 1:
        raise VertexSpecError(
            "worker_pools[0].replica_count: the first pool is the primary replica and has exactly 1; "
            "put the other replicas in a second pool"
        )
    env = params.get("env") or {}
    job_spec: dict[str, Any] = {"workerPoolSpecs": [worker_pool(p, i, env) for i, p in enumerate(pools)]}
    if params.get("service_account"):
        job_spec["serviceAccount"] = params["service_account"]
    if params.get("base_output_dir"):
        job_spec["baseOutputDirectory"] = {"outputUriPrefix": params["base_output_dir"]}
    scheduling: dict[str, Any] = {}
    if params.get("timeout"):
        scheduling["timeout"] = f"{int(params['timeout'])}s"
    if params.get("restart_job_on_worker_restart"):
        scheduling["restartJobOnWorkerRestart"] = True
    if scheduling:
        job_spec["scheduling"] = scheduling
    body: dict[str, Any] = {"displayName": params["display_name"], "jobSpec": job_spec}
    if params.get("labels"):
        body["labels"] = {k: str(v) for k, v in params["labels"].items()}
    return body


class VertexJobs:
    """CustomJob calls of one project and region, over one GcpClient."""

    def __init__(self, client: GcpClient, project: str, region: str) -> None:
        self.client = client
        self.parent = f"projects/{project}/locations/{region}"

    def find(self, display_name: str) -> list[dict[str, Any]]:
        """Every job of this display name, newest last."""
        found, token = [], None
        while True:
            params = {"pageSize": 100, **({"pageToken": token} if token else {})}
            page = self.client.get(f"{self.parent}/customJobs", params=params) or {}
            found += [j for j in page.get("customJobs", []) if j.get("displayName") == display_name]
            token = page.get("nextPageToken")
            if not token:
                return sorted(found, key=lambda j: j.get("createTime", ""))

    def get(self, name: str) -> dict[str, Any]:
        return self.client.get(name) or {}

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """One POST, not retried (see the module docstring)."""
        return self._post(f"{self.parent}/customJobs", body)

    def cancel(self, name: str) -> None:
        self._post(f"{name}:cancel", {})

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return post_json(self.client, self.client.url(path), body, "Vertex AI")

    def wait(self, name: str, timeout_s: float, poll_s: float, until: tuple[str, ...] = FINAL_STATES) -> dict:
        """Poll the job until its state is in ``until`` or ``timeout_s`` passes (then: as it is)."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(name)
            if job.get("state") in until or time.monotonic() >= deadline:
                return job
            time.sleep(poll_s)


def post_json(client: GcpClient, url: str, body: dict[str, Any], service: str) -> dict[str, Any]:
    """One POST with the client's token, never retried; Google's error message on failure."""
    try:
        resp = client.session.post(
            url, json=body, headers={"Authorization": f"Bearer {client.token()}"},
            timeout=client.config.request_timeout_s,
        )  # fmt: skip
    except NETWORK_ERRORS as exc:
        raise GcpError(f"POST {url}: {service} could not be reached ({type(exc).__name__}: {exc})") from None
    if resp.status_code >= 400:
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text[:300]
        raise GcpApiError(f"POST {url} -> HTTP {resp.status_code}: {message}", status=resp.status_code)
    return resp.json() if resp.content else {}


class VertexLogs:
    """A custom job's replica output, read from Cloud Logging (``entries:list``) over one GcpClient.

    Vertex writes each replica's lines as entries of resource ``ml_job`` labelled with the job's id
    and the replica's ``task_name`` (``workerpool0-0``). Reading is a POST that changes nothing, so
    a failed page may simply be asked for again by the caller's next poll.
    """

    def __init__(self, client: GcpClient, project: str, url: str) -> None:
        self.client = client
        self.project = project
        self.url = url

    @staticmethod
    def job_filter(job_id: str, since: str) -> str:
        """The query for one job's entries at or after ``since`` (an RFC 3339 timestamp)."""
        return f'resource.type="ml_job" AND resource.labels.job_id="{job_id}" AND timestamp>="{since}"'

    def entries(self, job_id: str, since: str) -> list[dict[str, Any]]:
        """Every entry of the job from ``since`` on, oldest first (equal timestamps by insertId)."""
        found: list[dict[str, Any]] = []
        body: dict[str, Any] = {
            "resourceNames": [f"projects/{self.project}"],
            "filter": self.job_filter(job_id, since),
            "orderBy": "timestamp asc",
            "pageSize": LOG_PAGE_SIZE,
        }
        while True:
            page = post_json(self.client, f"{self.url}entries:list", body, "Cloud Logging")
            found += page.get("entries", [])
            if not page.get("nextPageToken"):
                return found
            body["pageToken"] = page["nextPageToken"]
