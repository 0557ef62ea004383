"""Resource policies (regional): compact placement policies, and instances that name them.

forja puts the VMs of a cluster under one compact placement policy
(`groupPlacementPolicy.collocation: COLLOCATED`) where the machine series allows it. What Google
checks, and what is checked here: the policy exists in the instance's region, the machine series
accepts a compact placement (the catalog's `COMPACT_PLACEMENT_FAMILIES`, its one home), and a
policy that an instance still uses cannot be deleted.
"""

from __future__ import annotations

import copy
from typing import Any

from forja import machines

from . import catalog
from .errors import ApiError, already_exists, invalid_field, not_found, required_field
from .instances import NAME_RE, now, reference
from .listing import list_response
from .operations import ApiBase, Call

Json = dict[str, Any]


def supports_compact_placement(machine_type: str) -> bool:
    """The catalog's own answer (plugins/module_utils/forja_gcp_machines.py), never a copy."""
    return bool(machines.catalog().supports_compact_placement(machine_type))


def is_compact(policy: Json) -> bool:
    return (policy.get("groupPlacementPolicy") or {}).get("collocation") == "COLLOCATED"


class ResourcePolicyMethods(ApiBase):
    """resourcePolicies.insert/get/list/delete, and the check of an instance's `resourcePolicies`."""

    def _policies(self, project: str) -> dict[str, Json]:
        return self.store.resource_policies.setdefault(project, {})

    def _region(self, call: Call) -> str:
        region = call.params["region"]
        if region not in set(catalog.ZONES.values()):
            raise not_found(f"projects/{call.project}/regions/{region}")
        return region

    def _policy(self, call: Call) -> Json:
        region = self._region(call)
        name = call.params["resourcePolicy"]
        policy = self._policies(call.project).get(f"{region}/{name}")
        if policy is None:
            raise not_found(f"projects/{call.project}/regions/{region}/resourcePolicies/{name}")
        return policy

    def resource_policies_insert(self, call: Call) -> Json:
        region = self._region(call)
        body = copy.deepcopy(call.body or {})
        name = body.get("name") or ""
        if not name:
            raise required_field("resource.name")
        if not NAME_RE.fullmatch(name):
            raise invalid_field("resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'")
        kinds = [k for k in ("groupPlacementPolicy", "snapshotSchedulePolicy", "instanceSchedulePolicy",
                             "diskConsistencyGroupPolicy", "workloadPolicy") if body.get(k)]  # fmt: skip
        if len(kinds) != 1:
            raise invalid_field("resource", name, "Exactly one policy type must be specified.")
        link = f"{self._project_url(call.project)}/regions/{region}/resourcePolicies/{name}"
        body.update(
            {
                "kind": "compute#resourcePolicy",
                "id": self.store.next_id(),
                "creationTimestamp": now(),
                "region": f"{self._project_url(call.project)}/regions/{region}",
                "selfLink": link,
                "status": "READY",
                "description": body.get("description", ""),
            }
        )
        with self.store.lock:
            policies = self._policies(call.project)
            if f"{region}/{name}" in policies:
                raise already_exists(f"projects/{call.project}/regions/{region}/resourcePolicies/{name}")
            policies[f"{region}/{name}"] = body
            self.store.mark_dirty()
        op = self._new_operation(call, f"regions/{region}", "insert", link, body["id"])
        return self._launch(call, op, self._maybe_fail(call))

    def resource_policies_get(self, call: Call) -> Json:
        with self.store.lock:
            return copy.deepcopy(self._policy(call))

    def resource_policies_list(self, call: Call) -> Json:
        region = self._region(call)
        with self.store.lock:
            items = [
                copy.deepcopy(p)
                for key, p in sorted(self._policies(call.project).items())
                if key.startswith(f"{region}/")
            ]
        return list_response(
            self.base,
            call.query,
            "compute#resourcePolicyList",
            f"projects/{call.project}/regions/{region}/resourcePolicies",
            items,
        )

    def resource_policies_delete(self, call: Call) -> Json:
        with self.store.lock:
            policy = self._policy(call)
            for record in self.store.sorted_instances(call.project):
                if policy["selfLink"] in (record.data.get("resourcePolicies") or []):
                    path = policy["selfLink"].split("/compute/v1/", 1)[-1]
                    user = record.data["selfLink"].split("/compute/v1/", 1)[-1]
                    raise ApiError(
                        400,
                        f"The resource_policy resource '{path}' is already being used by '{user}'",
                        "resourceInUseByAnotherResource",
                    )
            region = call.params["region"]
            del self._policies(call.project)[f"{region}/{call.params['resourcePolicy']}"]
            self.store.mark_dirty()
        op = self._new_operation(call, f"regions/{region}", "delete", policy["selfLink"], policy["id"])
        return self._launch(call, op, self._maybe_fail(call))

    def instance_resource_policies(self, body: Json, project: str, zone: str) -> list[str]:
        """The full URLs of an insert body's `resourcePolicies`, or Google's refusal."""
        urls: list[str] = []
        region = catalog.ZONES[zone]
        machine_type = str(body.get("machineType") or "").rsplit("/", 1)[-1]
        for index, ref in enumerate(body.get("resourcePolicies") or []):
            field = f"resource.resourcePolicies[{index}]"
            ref_project, scope, name = reference(field, ref, project, "resourcePolicies")
            if scope != f"regions/{region}":
                raise invalid_field(
                    field, ref, f"Resource policy must be in the same region as the instance ('{region}')."
                )
            with self.store.lock:
                policy = self.store.resource_policies.get(ref_project, {}).get(f"{region}/{name}")
            if policy is None:
                raise not_found(f"projects/{ref_project}/regions/{region}/resourcePolicies/{name}")
            if is_compact(policy) and not supports_compact_placement(machine_type):
                series = machine_type.split("-", 1)[0].upper()
                raise invalid_field(
                    field,
                    ref,
                    f"Compact placement policies are not supported for the machine series {series} "
                    f"(machine type '{machine_type}').",
                )
            urls.append(policy["selfLink"])
        return urls
