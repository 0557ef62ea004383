# Copyright: forja contributors
# Apache-2.0
"""Everything that must hold before a cent is spent on a GPU VM, checked without creating anything.

Why a preflight: a new Google Cloud project has no GPU quota, Compute Engine off and nobody holding
the IAP role, and `forja up` would find each of those by failing, one per run. These checks ask the
same APIs what a create would need, read-only, and report every problem at once with its fix
(the gcp_gpu_preflight module runs them; `forja check` and `forja up` show them).

Each check yields findings; a finding's status is `ok`, `warn` (could not be checked, or worth
knowing), `fail` (blocks `forja up`) or `skip` (not checked because something it needs failed).
Where Google has a service of its own for the question (Service Usage for APIs, Resource Manager
for permissions, Cloud Billing for billing), it is asked on that service's host; against the
emulator, under the emulator's origin (`service_url`).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.forja.gpu.plugins.module_utils.forja_cost import (
    PricedVm,
    PriceError,
    load_prices,
    machine_rate,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    ENV_PROJECT,
    GcpApiError,
    GcpClient,
    GcpError,
    region_of,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_advice import (
    FLEX_START_BELOW,
    advise,
    flex_start_suggestion,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import (
    MACHINE_TYPES,
    MachineSpecError,
    resolve_gpus,
)

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
CONSOLE = "https://console.cloud.google.com"

#: The APIs a feature needs, with the title Google gives each.
SERVICES = {
    "compute.googleapis.com": "Compute Engine API",
    "iap.googleapis.com": "Cloud Identity-Aware Proxy API",
    "storage.googleapis.com": "Cloud Storage API",
    "aiplatform.googleapis.com": "Vertex AI API",
    "oslogin.googleapis.com": "Cloud OS Login API",
}

#: What `forja up` does, as IAM permissions on the project, and a predefined role that grants each.
PERMISSIONS: dict[str, dict[str, str]] = {
    "vm": {
        "compute.instances.create": "roles/compute.instanceAdmin.v1",
        "compute.instances.get": "roles/compute.instanceAdmin.v1",
        "compute.instances.start": "roles/compute.instanceAdmin.v1",
        "compute.instances.stop": "roles/compute.instanceAdmin.v1",
        "compute.instances.delete": "roles/compute.instanceAdmin.v1",
        "compute.instances.setMetadata": "roles/compute.instanceAdmin.v1",
        "compute.disks.create": "roles/compute.instanceAdmin.v1",
        "compute.subnetworks.use": "roles/compute.instanceAdmin.v1",
        "compute.firewalls.create": "roles/compute.securityAdmin",
        "compute.firewalls.get": "roles/compute.securityAdmin",
        "compute.networks.updatePolicy": "roles/compute.securityAdmin",
        "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",
    },
    "external_ip": {"compute.subnetworks.useExternalIp": "roles/compute.instanceAdmin.v1"},
    "iap": {"iap.tunnelInstances.accessViaIAP": "roles/iap.tunnelResourceAccessor"},
    "os_login": {"compute.instances.osAdminLogin": "roles/compute.osAdminLogin"},
    "bucket": {"storage.buckets.create": "roles/storage.admin", "storage.buckets.get": "roles/storage.admin"},
    "vertex": {"aiplatform.customJobs.create": "roles/aiplatform.user"},
}

#: Compute Engine's quota metric of each GPU model (the Spot one is PREEMPTIBLE_ + it).
GPU_QUOTA_METRICS = {
    "nvidia-l4": "NVIDIA_L4_GPUS",
    "nvidia-tesla-t4": "NVIDIA_T4_GPUS",
    "nvidia-tesla-v100": "NVIDIA_V100_GPUS",
    "nvidia-tesla-p100": "NVIDIA_P100_GPUS",
    "nvidia-tesla-p4": "NVIDIA_P4_GPUS",
    "nvidia-tesla-a100": "NVIDIA_A100_GPUS",
    "nvidia-a100-80gb": "NVIDIA_A100_80GB_GPUS",
    "nvidia-h100-80gb": "NVIDIA_H100_GPUS",
    "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
    "nvidia-h200-141gb": "NVIDIA_H200_GPUS",
}
#: Persistent-disk types and the regional quota their size counts against.
DISK_QUOTA_METRICS = {
    "pd-standard": "DISKS_TOTAL_GB", "pd-balanced": "SSD_TOTAL_GB", "pd-ssd": "SSD_TOTAL_GB",
}
#: The report's order: what the next checks stand on first, the price last.
ORDER = ("credentials", "project", "billing", "api", "permissions", "placement", "image", "quota",
         "capacity", "this machine", "price")


@dataclass
class Finding:
    """One line of the report: what was checked, what was found, and what to do about it."""

    check: str
    subject: str
    status: str
    detail: str
    fix: str = ""
    link: str = ""


@dataclass
class Plan:
    """The VM (or cluster) that `forja up` would make, and what around it the user asked for."""

    project: str
    name: str = "forja-l4"
    count: int = 1
    zone: str = "us-east1-d"
    fallback_zones: list[str] = field(default_factory=list)
    machine_type: str = "g2-standard-8"
    gpu_type: str = ""
    gpu_count: int = 0
    spot: bool = False
    image_family: str = ""
    image: str = ""
    image_project: str = "deeplearning-platform-release"
    disk_size_gb: int = 300
    disk_type: str = "pd-balanced"
    external_ip: bool = True
    ssh_mode: str = "iap"
    ssh_key_file: str = ""
    iap_command: str = "gcloud compute start-iap-tunnel"
    os_login: bool = False
    features: list[str] = field(default_factory=list)
    #: A Spot VM whose best zone scores below this obtainability gets a Flex-start suggestion.
    flex_start_below: float = FLEX_START_BELOW

    @property
    def zones(self) -> list[str]:
        return list(dict.fromkeys([self.zone, *self.fallback_zones]))


def service_url(api_url: str, service: str, version: str) -> str:
    """Another Google API beside Compute: its own host on Google, a path of the emulator's origin."""
    parts = urlsplit(api_url)
    if parts.hostname and parts.hostname.endswith("googleapis.com"):
        return f"https://{service}.googleapis.com/{version}/"
    return f"{parts.scheme}://{parts.netloc}/{service}/{version}/"


def activation_link(service: str, project: str) -> str:
    return f"https://console.developers.google.com/apis/api/{service}/overview?project={project}"


class Preflight:
    """Runs the checks in order; a check whose premise failed is reported as skipped, never guessed."""

    def __init__(self, client: GcpClient, plan: Plan, env: dict[str, str] | None = None) -> None:
        self.client = client
        self.plan = plan
        self.env = os.environ if env is None else env
        self.findings: list[Finding] = []
        self.compute_ok = False
        self.project_exists = False
        self.api_url = client.api_url

    def add(self, check: str, subject: str, status: str, detail: str, fix: str = "", link: str = "") -> None:
        self.findings.append(Finding(check, subject, status, detail, fix, link))

    # --- the checks ---------------------------------------------------------------------------

    def run(self) -> list[Finding]:
        started = time.monotonic()
        if self.credentials():
            self.project()
            if self.project_exists:
                self.billing()
                self.apis()
                self.permissions()
            else:
                for check in ("billing", "apis", "permissions"):
                    self.add(check, "-", SKIP, "not checked: the project could not be used (see above)")
            if self.compute_ok:
                zones_ok = self.placement()
                self.image()
                if zones_ok:
                    self.quota()
                    self.capacity()
            else:
                for check in ("placement", "image"):
                    self.add(check, "-", SKIP, "not checked: Compute Engine cannot be asked (see above)")
                if self.project_exists:
                    self.quota_unread()
        else:
            for check in ("project", "billing", "apis", "permissions", "placement", "image", "quota"):
                self.add(check, "-", SKIP, "not checked: needs working credentials")
        self.this_machine()
        self.price()
        self.findings.sort(key=lambda f: ORDER.index(f.check) if f.check in ORDER else len(ORDER))
        self.elapsed_s = round(time.monotonic() - started, 2)
        return self.findings

    def credentials(self) -> bool:
        cfg = self.client.config
        key_file = cfg.resolved_credentials_file()
        if cfg.credentials_json or key_file:
            source = f"service-account key {key_file or '(credentials_json)'}"
        elif cfg.resolved_access_token():
            source = "access token (FORJA_GCP_ACCESS_TOKEN)"
        elif cfg.auth_kind == "machineaccount":
            source = "this VM's service account (metadata server)"
        else:
            source = "application default credentials"
        try:
            self.client.token()
        except GcpError as exc:
            self.add("credentials", source, FAIL, exc.message.split(". What to do")[0],
                     "give forja a service-account JSON key (FORJA_GCP_CREDENTIALS_FILE, or "
                     "gcp_instance_credentials_file in the inventory's group_vars) or run "
                     "'gcloud auth application-default login'")
            return False
        who = self.client.principal()
        self.add("credentials", source, OK, f"a token was minted for {who}")
        return True

    def _error(self, exc: GcpApiError) -> tuple[str, str]:
        """(reason, activation link) of an API error: SERVICE_DISABLED and its link, or Google's reason."""
        info = exc.error_info()
        if info.get("reason") == "SERVICE_DISABLED":
            return "SERVICE_DISABLED", str((info.get("metadata") or {}).get("activationUrl") or "")
        return str(exc.reason or info.get("reason") or exc.status), ""

    def project(self) -> None:
        project = self.plan.project
        try:
            found = self.client.get(
                f"projects/{project}", params={"fields": "name,id,quotas"}, allow_404=True
            )
        except GcpApiError as exc:
            reason, link = self._error(exc)
            if reason == "SERVICE_DISABLED":
                self.project_exists = True
                self.add("project", project, OK, "exists (Compute Engine answered for it)")
                self.add("api", "compute.googleapis.com", FAIL,
                         "Compute Engine API is disabled in the project",
                         f"enable it: gcloud services enable compute.googleapis.com --project {project}",
                         link or activation_link("compute.googleapis.com", project))
                self._services_checked = {"compute.googleapis.com"}
                return
            self.add("project", project, FAIL,
                     f"{self.client.principal()} may not use project '{project}' (HTTP {exc.status}: "
                     f"{_google_words(exc)})",
                     "grant the account a role on the project (e.g. roles/compute.instanceAdmin.v1), or fix "
                     f"the project id (projects in the inventory's gcp_gpu.yml, or {ENV_PROJECT})")
            return
        if found is None:
            self.add("project", project, FAIL, f"project '{project}' does not exist{self._did_you_mean()}",
                     f"fix the project id: projects in the inventory's gcp_gpu.yml, or {ENV_PROJECT} "
                     "('gcloud projects list' shows yours)")
            return
        self.compute_ok = self.project_exists = True
        self.project_quotas = found.get("quotas") or []
        self.add("project", project, OK, "exists; Compute Engine answers for it")

    def _did_you_mean(self) -> str:
        """The projects these credentials can see that look like the one asked for (Resource Manager)."""
        try:
            found = self.client.get(
                service_url(self.api_url, "cloudresourcemanager", "v3") + "projects:search"
            )
        except GcpError:
            return ""
        ids = [p.get("projectId", "") for p in (found or {}).get("projects") or []]
        close = difflib.get_close_matches(self.plan.project, ids, n=3, cutoff=0.6)
        if close:
            return "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
        if ids:
            return f"; these credentials see {', '.join(sorted(ids)[:5])}"
        return "; these credentials see no project at all"

    def billing(self) -> None:
        project = self.plan.project
        url = service_url(self.api_url, "cloudbilling", "v1") + f"projects/{project}/billingInfo"
        try:
            info = self.client.get(url) or {}
        except GcpError as exc:
            reason, link = self._error(exc) if isinstance(exc, GcpApiError) else ("", "")
            why = ("the Cloud Billing API is disabled in the credentials' project"
                   if reason == "SERVICE_DISABLED" else _google_words(exc))
            self.add("billing", project, WARN, f"could not be read: {why}",
                     f"check it at {CONSOLE}/billing/linkedaccount?project={project}", link)
            return
        if info.get("billingEnabled"):
            self.add("billing", project, OK, f"enabled ({info.get('billingAccountName', '')})")
        else:
            self.add("billing", project, FAIL, "billing is not enabled: Google creates no VM without it",
                     "link a billing account to the project",
                     f"{CONSOLE}/billing/linkedaccount?project={project}")

    def needed_services(self) -> list[str]:
        plan = self.plan
        needed = ["compute.googleapis.com"]
        if plan.ssh_mode == "iap":
            needed.append("iap.googleapis.com")
        if plan.os_login:
            needed.append("oslogin.googleapis.com")
        if "bucket" in plan.features:
            needed.append("storage.googleapis.com")
        if "vertex" in plan.features:
            needed.append("aiplatform.googleapis.com")
        return needed

    def apis(self) -> None:
        project = self.plan.project
        done = getattr(self, "_services_checked", set())
        needed = [s for s in self.needed_services() if s not in done]
        if self.compute_ok and "compute.googleapis.com" in needed:
            needed.remove("compute.googleapis.com")
            self.add("api", "compute.googleapis.com", OK, "enabled")
        if not needed:
            return
        base = service_url(self.api_url, "serviceusage", "v1") + f"projects/{project}/services:batchGet"
        try:
            names = [f"projects/{project}/services/{s}" for s in needed]
            answer = self.client.get(base, params={"names": names})
        except GcpError as exc:
            for service in needed:
                self.add("api", service, WARN, f"could not be checked ({_google_words(exc)})",
                         f"make sure it is enabled: gcloud services enable {service} --project {project}",
                         activation_link(service, project))
            return
        states = {s.get("config", {}).get("name") or s.get("name", "").rsplit("/", 1)[-1]: s.get("state")
                  for s in (answer or {}).get("services") or []}
        for service in needed:
            if states.get(service) == "ENABLED":
                self.add("api", service, OK, "enabled")
            else:
                self.add("api", service, FAIL, f"{SERVICES.get(service, service)} is disabled in the project",
                         f"enable it: gcloud services enable {service} --project {project}",
                         activation_link(service, project))

    def permissions(self) -> None:
        plan = self.plan
        wanted: dict[str, str] = dict(PERMISSIONS["vm"])
        for feature, on in (("external_ip", plan.external_ip), ("iap", plan.ssh_mode == "iap"),
                            ("os_login", plan.os_login), ("bucket", "bucket" in plan.features),
                            ("vertex", "vertex" in plan.features)):
            if on:
                wanted.update(PERMISSIONS[feature])
        url = (service_url(self.api_url, "cloudresourcemanager", "v3")
               + f"projects/{plan.project}:testIamPermissions")
        who = self.client.principal()
        try:
            answer = self.client.request("POST", url, body={"permissions": sorted(wanted)}) or {}
        except GcpError as exc:
            reason, link = self._error(exc) if isinstance(exc, GcpApiError) else ("", "")
            why = ("the Cloud Resource Manager API is disabled in the credentials' project"
                   if reason == "SERVICE_DISABLED" else _google_words(exc))
            self.add("permissions", who, WARN, f"could not be checked: {why}",
                     "enable it (gcloud services enable cloudresourcemanager.googleapis.com) to have "
                     "them checked", link)
            return
        granted = set(answer.get("permissions") or [])
        missing = sorted(set(wanted) - granted)
        if not missing:
            self.add("permissions", who, OK, f"holds the {len(wanted)} permissions forja up needs")
            return
        roles = sorted({wanted[p] for p in missing})
        member = _member(who)
        grants = "; ".join(
            f"gcloud projects add-iam-policy-binding {plan.project} --member={member} --role={role}"
            for role in roles
        )
        self.add("permissions", who, FAIL, f"lacks {', '.join(missing)}",
                 f"grant {', '.join(roles)}: {grants}", f"{CONSOLE}/iam-admin/iam?project={plan.project}")

    def placement(self) -> bool:
        """Each zone exists and offers the machine type (and attached GPU); False when the first does not."""
        plan = self.plan
        try:
            spec = resolve_gpus(plan.machine_type, plan.gpu_type or None, plan.gpu_count or None)
        except MachineSpecError as exc:
            self.add("placement", plan.machine_type, FAIL, str(exc).split("; ", 1)[0],
                     str(exc).split("; ", 1)[-1])
            return False
        self.gpu_spec = spec
        first_ok = False
        for index, zone in enumerate(plan.zones):
            found = self.client.get(f"projects/{plan.project}/zones/{zone}", allow_404=True)
            if found is None:
                self.add("placement", zone, FAIL, f"zone '{zone}' does not exist{self._zones_like(zone)}",
                         "fix gcp_instance_zone / gcp_instance_fallback_zones in the inventory's group_vars")
                continue
            where = f"projects/{plan.project}/zones/{zone}"
            machine = self.client.get(f"{where}/machineTypes/{plan.machine_type}", allow_404=True)
            if machine is None:
                self.add("placement", zone, FAIL, f"{plan.machine_type} is not offered in {zone}",
                         "pick a zone that offers it ('gcloud compute machine-types list "
                         f"--filter=name={plan.machine_type}')")
                continue
            gpu_path = f"{where}/acceleratorTypes/{spec.gpu_type}"
            if spec.attach and spec.gpu_type and self.client.get(gpu_path, allow_404=True) is None:
                self.add("placement", zone, FAIL, f"{spec.gpu_type} is not offered in {zone}",
                         "pick a zone that offers it ('gcloud compute accelerator-types list "
                         f"--filter=name={spec.gpu_type}')")
                continue
            gpus = f" with {spec.gpu_count} x {spec.gpu_type}" if spec.gpu_type else ""
            self.add("placement", zone, OK, f"{plan.machine_type}{gpus} is offered"
                     + (" (fallback)" if index else ""))
            self.vcpus = int(machine.get("guestCpus") or 0)
            first_ok = first_ok or index == 0
        return first_ok

    def _zones_like(self, zone: str) -> str:
        try:
            names = [z["name"] for page in self.client.pages(f"projects/{self.plan.project}/zones")
                     for z in page.get("items") or []]
        except GcpError:
            return ""
        close = difflib.get_close_matches(zone, names, n=3, cutoff=0.7)
        in_region = sorted(n for n in names if n.startswith(region_of(zone) + "-"))
        if close:
            return "; did you mean " + " or ".join(close) + "?"
        if in_region:
            return f"; {region_of(zone)} has {', '.join(in_region)}"
        return ""

    def image(self) -> None:
        plan = self.plan
        if plan.image:
            path, what = f"projects/{plan.image_project}/global/images/{plan.image}", f"image {plan.image}"
        else:
            path = f"projects/{plan.image_project}/global/images/family/{plan.image_family}"
            what = f"image family {plan.image_family}"
        try:
            found = self.client.get(path, allow_404=True)
        except GcpApiError as exc:
            self.add("image", what, FAIL, f"cannot be read: {_google_words(exc)}",
                     f"check gcp_instance_image_project ({plan.image_project}) and the account's "
                     "access to it")
            return
        if found is None:
            self.add("image", what, FAIL, f"{what} does not exist in project {plan.image_project}",
                     "fix gcp_instance_image_family (Deep Learning VM families: 'gcloud compute images list "
                     "--project deeplearning-platform-release --no-standard-images')")
            return
        name = found.get("name", "")
        state = (found.get("deprecated") or {}).get("state", "")
        pins = re.findall(r"cu\d+|nvidia-\d+", plan.image_family or plan.image)
        missing = [pin for pin in pins if pin not in name]
        if state in ("OBSOLETE", "DELETED"):
            self.add("image", what, FAIL, f"resolves to {name}, which is {state}",
                     "pick a current image family")
        elif missing:
            self.add("image", what, WARN, f"resolves to {name}, which does not carry {', '.join(missing)}",
                     "forja pins the NVIDIA 570 driver and CUDA 12.8; pick an image family that carries them")
        else:
            pinned = f" (carries {', '.join(pins)})" if pins else ""
            self.add("image", what, OK, f"resolves to {name}{pinned}")

    def quota(self) -> None:
        plan, spec = self.plan, self.gpu_spec
        running = self._running_members()
        to_start = max(plan.count - running, 0)
        if not to_start:
            self.add("quota", plan.name, OK, "every VM is already running: no new quota needed")
            return
        region = region_of(plan.zone)
        try:
            found = self.client.get(f"projects/{plan.project}/regions/{region}") or {}
        except GcpError as exc:
            self.add("quota", region, WARN, f"could not be read: {_google_words(exc)}",
                     f"look at {CONSOLE}/iam-admin/quotas?project={plan.project}")
            return
        regional = {q.get("metric"): q for q in found.get("quotas") or []}
        project_quotas = {q.get("metric"): q for q in getattr(self, "project_quotas", [])}
        needs: list[tuple[str, dict[str, Any], int, str]] = []
        if spec.gpu_type:
            metric = GPU_QUOTA_METRICS.get(spec.gpu_type, spec.gpu_type.upper().replace("-", "_") + "_GPUS")
            gpus = spec.gpu_count * to_start
            needs.append((self._spot_metric(metric, regional, gpus), regional, gpus, region))
            needs.append(("GPUS_ALL_REGIONS", project_quotas, gpus, "all regions"))
        vcpus = getattr(self, "vcpus", 0) or (MACHINE_TYPES[plan.machine_type].vcpus
                                              if plan.machine_type in MACHINE_TYPES else 0)
        if vcpus:
            cpus = vcpus * to_start
            needs.append((self._spot_metric("CPUS", regional, cpus), regional, cpus, region))
        disk_metric = DISK_QUOTA_METRICS.get(plan.disk_type)
        if disk_metric:
            needs.append((disk_metric, regional, plan.disk_size_gb * to_start, region))
        for metric, quotas, need, where in needs:
            quota = quotas.get(metric)
            if quota is None:
                self.add("quota", f"{metric} ({where})", WARN, "Google did not list this quota",
                         f"look at {CONSOLE}/iam-admin/quotas?project={plan.project}")
                continue
            limit, usage = float(quota.get("limit") or 0), float(quota.get("usage") or 0)
            room = limit - usage
            figures = f"limit {limit:g}, in use {usage:g}, {plan.name} needs {need:g}"
            if room >= need:
                self.add("quota", f"{metric} ({where})", OK, figures)
            else:
                self.add("quota", f"{metric} ({where})", FAIL, figures,
                         f"request {metric} of at least {usage + need:g} in {where} (IAM & Admin > Quotas; "
                         "new projects also need GPUS_ALL_REGIONS of 1 or more, and may wait up to 2 days)",
                         f"{CONSOLE}/iam-admin/quotas?project={plan.project}&metric={metric}")

    def capacity(self) -> None:
        """A Spot VM that Google says it can hardly give anywhere asked: suggest Flex-start (a warning,
        never a block; an advisor with no answer for the project says nothing here)."""
        plan = self.plan
        if not plan.spot:
            return
        advice = advise(self.client, plan.project, plan.zones, plan.machine_type, True,
                        plan.gpu_type, plan.gpu_count)
        suggestion = flex_start_suggestion(advice, plan.machine_type, plan.flex_start_below)
        if suggestion:
            best = max(a.obtainability or 0.0 for a in advice)
            self.add("capacity", f"{plan.machine_type} Spot", WARN,
                     f"Google's capacity advice scores Spot obtainability at most {best:.2f} in "
                     f"{', '.join(plan.zones)}", suggestion,
                     "https://cloud.google.com/compute/docs/instances/about-flex-start-vms")

    def quota_unread(self) -> None:
        """Compute Engine is off, so it lists no quota; a project that never used it has no GPU quota."""
        plan = self.plan
        try:
            spec = resolve_gpus(plan.machine_type, plan.gpu_type or None, plan.gpu_count or None)
        except MachineSpecError:
            return
        if not spec.gpu_type:
            return
        metric = GPU_QUOTA_METRICS.get(spec.gpu_type, "GPU")
        metric = f"PREEMPTIBLE_{metric}" if plan.spot else metric
        need = spec.gpu_count * plan.count
        self.add("quota", "GPUs", WARN,
                 "cannot be read while Compute Engine is off; a project that never used it has "
                 "GPUS_ALL_REGIONS 0",
                 f"once the API is on, run forja check again; a new project then requests GPUS_ALL_REGIONS "
                 f"and {metric} in {region_of(plan.zone)} of at least {need} (approval can take 2 days)",
                 f"{CONSOLE}/iam-admin/quotas?project={plan.project}")

    def _spot_metric(self, metric: str, regional: dict[str, Any], need: int) -> str:
        """Spot VMs use the PREEMPTIBLE_ quota when the project has some, else the standard one."""
        if not self.plan.spot:
            return metric
        preemptible = regional.get("PREEMPTIBLE_" + metric)
        return "PREEMPTIBLE_" + metric if preemptible and float(preemptible.get("limit") or 0) > 0 else metric

    def _running_members(self) -> int:
        plan = self.plan
        names = {plan.name} if plan.count == 1 else {f"{plan.name}-{i}" for i in range(plan.count)}
        running = 0
        for zone in plan.zones:
            for name in names:
                found = self.client.get_instance(plan.project, zone, name)
                if found and found.get("status") == "RUNNING":
                    running += 1
        return running

    def this_machine(self) -> None:
        plan = self.plan
        if plan.ssh_key_file:
            key = os.path.expanduser(plan.ssh_key_file)
            if os.path.isfile(key) and os.path.isfile(key + ".pub"):
                self.add("this machine", "SSH key", OK, f"{plan.ssh_key_file} and its .pub exist")
            elif os.path.exists(key):
                self.add("this machine", "SSH key", FAIL,
                         f"{plan.ssh_key_file} exists but {plan.ssh_key_file}.pub does not",
                         f"write it: ssh-keygen -y -f {plan.ssh_key_file} > {plan.ssh_key_file}.pub")
            else:
                self.add("this machine", "SSH key", OK,
                         f"{plan.ssh_key_file} does not exist: forja up creates it")
        if plan.ssh_mode == "iap":
            program = (plan.iap_command.split() or ["gcloud"])[0]
            where = shutil.which(program, path=self.env.get("PATH"))
            if where:
                found = f"{program} is {where}" if where != program else f"{program} is there"
                self.add("this machine", "IAP tunnel", OK, found)
            else:
                self.add("this machine", "IAP tunnel", FAIL,
                         f"{program} is not on PATH: the iap SSH path runs '{plan.iap_command}'",
                         "install the gcloud CLI (https://cloud.google.com/sdk/docs/install), or set "
                         "gcp_instance_ssh_mode: direct")

    def price(self) -> None:
        plan = self.plan
        spec = getattr(self, "gpu_spec", None)
        try:
            prices = load_prices(env=self.env)
            gpus = {spec.gpu_type: spec.gpu_count} if spec and spec.gpu_type else {}
            rate = machine_rate(PricedVm(plan.name, plan.zone, plan.machine_type, plan.spot, gpus), prices)
            disk = prices.disk_price(plan.disk_type, region_of(plan.zone))
        except (PriceError, OSError, ValueError) as exc:
            self.add("price", plan.machine_type, WARN, f"no price: {exc}")
            return
        hourly = rate.usd_per_hour * plan.count
        disk_month = disk.usd_per_gb_month * plan.disk_size_gb * plan.count
        kind = "Spot" if plan.spot else "on-demand"
        self.add("price", f"{plan.count} x {plan.machine_type} {kind}", OK,
                 f"${hourly:.2f} an hour; ${hourly * prices.hours_per_month + disk_month:,.0f} a month "
                 "if left running; "
                 f"${disk_month:.2f} a month for the {plan.disk_size_gb} GB disk while stopped"
                 + (" (estimated prices)" if "estimate" in rate.basis else ""))


def _member(principal: str) -> str:
    email = principal.rsplit(" ", 1)[-1]
    if "@" not in email:
        return "user:YOU@example.com"
    return f"serviceAccount:{email}" if email.endswith("gserviceaccount.com") else f"user:{email}"


def _google_words(exc: GcpError) -> str:
    """What Google said, without the URL forja called."""
    message = exc.message.split(" -> ", 1)[-1]
    return message.split(". What to do:", 1)[0]


def problem(finding: Finding) -> str:
    """A blocking finding as one line for people: what, what was found, what to do, where."""
    fix = f"; {finding.fix}" if finding.fix else ""
    link = f" ({finding.link})" if finding.link and finding.link not in finding.fix else ""
    return f"{finding.check} {finding.subject}: {finding.detail}{fix}{link}"


def report(findings: list[Finding]) -> dict[str, Any]:
    """The module's result: every finding, the blocking ones as lines for people, and whether any blocks."""
    problems = [problem(f) for f in findings if f.status == FAIL]
    return {"findings": [asdict(f) for f in findings], "blocking": bool(problems), "problems": problems,
            "summary": "; ".join(problems)}
