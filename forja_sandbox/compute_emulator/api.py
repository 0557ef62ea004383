"""`ComputeApi`: the implemented Compute v1 methods behind one `dispatch`.

`dispatch` receives a routed, authenticated, schema-checked call, applies the checks every
method shares (project and zone exist, injected faults, `requestId` replay) and runs the
method, which returns the response JSON (a dict, or pre-encoded bytes for big listings). The
methods themselves live in `instance_methods` and `resource_methods`; operations in `operations`.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from typing import Any

from . import api_gate, catalog
from .advice import AdviceMethods, AdviceSettings
from .errors import ApiError, not_found
from .guest_attributes import GuestAttributeMethods
from .instance_methods import InstanceMethods
from .operations import Call, InstanceBackend, OperationFailed
from .resource_methods import ResourceMethods
from .resource_policies import ResourcePolicyMethods

Json = dict[str, Any]
COMPUTE_SERVICE = "compute.googleapis.com"
#: Method verbs whose IAM permission has another verb (`instances.insert` needs `...create`).
_PERMISSION_VERBS = {"insert": "create", "aggregatedList": "list", "wait": "get"}


def compute_permission(method_id: str) -> str:
    """The IAM permission a Compute method needs: `compute.instances.insert` -> `compute.instances.create`."""
    _, collection, verb = method_id.split(".")
    return f"compute.{collection}.{_PERMISSION_VERBS.get(verb, verb)}"


class ComputeApi(
    InstanceMethods, ResourceMethods, ResourcePolicyMethods, GuestAttributeMethods, AdviceMethods
):
    """Every implemented Compute method, by discovery id, behind one `dispatch`."""

    #: The capacity advisor's scores (the emulator's `set_advice`); one per emulator.
    advice: AdviceSettings = AdviceSettings()

    @functools.cached_property
    def _handlers(self) -> dict[str, Callable[[Call], Json | bytes]]:
        return {
            "compute.instances.aggregatedList": self.instances_aggregated_list,
            "compute.instances.list": self.instances_list,
            "compute.instances.get": self.instances_get,
            "compute.instances.insert": self.instances_insert,
            "compute.instances.delete": self.instances_delete,
            "compute.instances.start": self.instances_start,
            "compute.instances.stop": self.instances_stop,
            "compute.instances.setLabels": self.instances_set_labels,
            "compute.instances.setMetadata": self.instances_set_metadata,
            "compute.instances.setTags": self.instances_set_tags,
            "compute.instances.getGuestAttributes": self.instances_get_guest_attributes,
            "compute.instances.simulateMaintenanceEvent": self.instances_simulate_maintenance_event,
            "compute.zoneOperations.get": self.operations_get,
            "compute.zoneOperations.wait": self.operations_wait,
            "compute.zoneOperations.list": self.operations_list,
            "compute.zoneOperations.delete": self.operations_delete,
            "compute.globalOperations.get": self.operations_get,
            "compute.globalOperations.wait": self.operations_wait,
            "compute.globalOperations.list": self.operations_list,
            "compute.globalOperations.delete": self.operations_delete,
            "compute.regionOperations.get": self.operations_get,
            "compute.regionOperations.wait": self.operations_wait,
            "compute.regionOperations.list": self.operations_list,
            "compute.regionOperations.delete": self.operations_delete,
            "compute.resourcePolicies.insert": self.resource_policies_insert,
            "compute.resourcePolicies.get": self.resource_policies_get,
            "compute.resourcePolicies.list": self.resource_policies_list,
            "compute.resourcePolicies.delete": self.resource_policies_delete,
            "compute.firewalls.insert": self.firewalls_insert,
            "compute.firewalls.get": self.firewalls_get,
            "compute.firewalls.list": self.firewalls_list,
            "compute.firewalls.delete": self.firewalls_delete,
            "compute.firewalls.patch": self.firewalls_patch,
            "compute.zones.get": self.zones_get,
            "compute.zones.list": self.zones_list,
            "compute.machineTypes.get": self.machine_types_get,
            "compute.machineTypes.list": self.machine_types_list,
            "compute.acceleratorTypes.get": self.accelerator_types_get,
            "compute.acceleratorTypes.list": self.accelerator_types_list,
            "compute.images.get": self.images_get,
            "compute.images.getFromFamily": self.images_get_from_family,
            "compute.images.list": self.images_list,
            "compute.networks.get": self.networks_get,
            "compute.networks.list": self.networks_list,
            "compute.projects.get": self.projects_get,
            "compute.regions.get": self.regions_get,
            "compute.regions.list": self.regions_list,
            "compute.advice.capacity": self.advice_capacity,
            "compute.advice.capacityHistory": self.advice_capacity_history,
            "compute.advice.calendarMode": self.advice_calendar_mode,
        }

    def implements(self, method_id: str) -> bool:
        return method_id in self._handlers

    def dispatch(self, call: Call) -> Json | bytes:
        self._check_scope(call)
        call.faults = self.faults.take(call.method.id, call.params.get("project"), call.params.get("zone"))
        for fault in call.faults:
            if fault.status:
                raise fault.api_error()
        request_id = call.query.get("requestId")
        if request_id:
            with self.store.lock:
                key = self.store.request_ids.get((call.project, request_id))
                if key and key in self.store.operations:
                    return copy.deepcopy(self.store.operations[key])
        delay = call.fault("delay")
        returns_operation = call.method.http_method != "GET" and "Operations." not in call.method.id
        if delay and not returns_operation:
            time.sleep(delay.delay_s)
        result = self._handlers[call.method.id](call)
        if request_id and isinstance(result, dict) and result.get("kind") == "compute#operation":
            with self.store.lock:
                key = self._op_key(result)
                self.store.request_ids[(call.project, request_id)] = key
                # GCE echoes the caller's requestId on the operation.
                result["clientOperationId"] = request_id
                if key in self.store.operations:
                    self.store.operations[key]["clientOperationId"] = request_id
        return result

    def _check_scope(self, call: Call) -> None:
        """404 for unknown projects and zones, 403 for public image projects outside images; for a
        served project, SERVICE_DISABLED when it has not enabled Compute, 403 for a permission the
        caller lacks (the project's `denied_permissions`, or a project it may not see)."""
        project = call.params.get("project")
        if project is not None and project not in self.store.projects:
            if project in catalog.IMAGE_PROJECTS:
                if not call.method.id.startswith("compute.images."):
                    raise ApiError(
                        403, f"Required '{call.method.id}' permission for 'projects/{project}'", "forbidden"
                    )
            else:
                raise not_found(f"projects/{project}")
        elif project is not None:
            api_gate.require_enabled(self.store, project, COMPUTE_SERVICE)
            permission = compute_permission(call.method.id)
            if not self.store.settings_for(project).holds(call.principal, permission):
                message = f"Required '{permission}' permission for 'projects/{project}'"
                raise ApiError(403, message, "forbidden")
        zone = call.params.get("zone")
        if zone is not None and zone not in catalog.ZONES:
            raise not_found(f"projects/{project}/zones/{zone}")
        region = call.params.get("region")
        if region is not None and region not in set(catalog.ZONES.values()):
            raise not_found(f"projects/{project}/regions/{region}")


__all__ = ["Call", "ComputeApi", "InstanceBackend", "OperationFailed"]
