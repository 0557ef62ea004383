"""Firewalls (global, with global operations) and the read-only catalog methods."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from . import catalog, quotas
from .errors import already_exists, invalid_field, not_found
from .firewalls import build_firewall
from .listing import list_response
from .operations import ApiBase, Call
from .project_settings import ProjectSettings, QuotaKey

Json = dict[str, Any]
_T = TypeVar("_T", catalog.MachineType, catalog.AcceleratorType)


@dataclass(frozen=True)
class _ZonalTypes(Generic[_T]):
    """A zonal collection of the catalog's types: its path, parameter and list kind, which types a zone
    offers, and a type's resource (base URL, project, zone, type)."""

    collection: str
    parameter: str
    list_kind: str
    offered: Callable[[str], list[_T]]
    resource: Callable[[str, str, str, _T], Json]


_MACHINE_TYPES = _ZonalTypes(
    "machineTypes", "machineType", "compute#machineTypeList", catalog.machine_types_in,
    catalog.machine_type_resource,
)  # fmt: skip
_ACCELERATOR_TYPES = _ZonalTypes(
    "acceleratorTypes", "acceleratorType", "compute#acceleratorTypeList", catalog.accelerators_in,
    catalog.accelerator_type_resource,
)  # fmt: skip


class ResourceMethods(ApiBase):
    """firewalls.*, zones, regions, machineTypes, acceleratorTypes, images, networks, projects.get."""

    def _firewall(self, call: Call) -> Json:
        firewall = self.store.firewalls[call.project].get(call.params["firewall"])
        if firewall is None:
            raise not_found(f"projects/{call.project}/global/firewalls/{call.params['firewall']}")
        return firewall

    def _firewall_operation(self, call: Call, op_type: str, firewall: Json) -> Json:
        """The global operation of `op_type` on `firewall`; when it ends, the hosts get the stored rules."""
        op = self._new_operation(call, "global", op_type, firewall["selfLink"], firewall["id"])
        return self._launch(call, op, self._then_sync_firewalls(call.project, self._maybe_fail(call)))

    def firewalls_insert(self, call: Call) -> Json:
        firewall = build_firewall(call.body or {}, call.project, self.base, self.store.next_id())
        with self.store.lock:
            if firewall["name"] in self.store.firewalls[call.project]:
                raise already_exists(f"projects/{call.project}/global/firewalls/{firewall['name']}")
            self.store.firewalls[call.project][firewall["name"]] = firewall
            self.store.mark_dirty()
        return self._firewall_operation(call, "insert", firewall)

    def firewalls_get(self, call: Call) -> Json:
        with self.store.lock:
            return copy.deepcopy(self._firewall(call))

    def firewalls_list(self, call: Call) -> Json:
        with self.store.lock:
            items = [copy.deepcopy(f) for _n, f in sorted(self.store.firewalls[call.project].items())]
        return list_response(
            self.base, call.query, "compute#firewallList", f"projects/{call.project}/global/firewalls", items
        )

    def firewalls_patch(self, call: Call) -> Json:
        body = call.body or {}
        with self.store.lock:
            current = self._firewall(call)
            if body.get("name") not in (None, current["name"]):
                raise invalid_field("resource.name", body["name"], "The name of a firewall cannot change.")
            patched = build_firewall(body, call.project, self.base, self.store.next_id(), current)
            self.store.firewalls[call.project][current["name"]] = patched
            self.store.mark_dirty()
        return self._firewall_operation(call, "patch", patched)

    def firewalls_delete(self, call: Call) -> Json:
        with self.store.lock:
            firewall = self._firewall(call)
            del self.store.firewalls[call.project][firewall["name"]]
            self.store.mark_dirty()
        return self._firewall_operation(call, "delete", firewall)

    def zones_get(self, call: Call) -> Json:
        return catalog.zone_resource(self.base, call.project, call.zone)

    def zones_list(self, call: Call) -> Json:
        zones = [catalog.zone_resource(self.base, call.project, z) for z in sorted(catalog.ZONES)]
        return list_response(
            self.base, call.query, "compute#zoneList", f"projects/{call.project}/zones", zones
        )

    def machine_types_get(self, call: Call) -> Json:
        return self._zonal_get(call, _MACHINE_TYPES)

    def machine_types_list(self, call: Call) -> Json:
        return self._zonal_list(call, _MACHINE_TYPES)

    def accelerator_types_get(self, call: Call) -> Json:
        return self._zonal_get(call, _ACCELERATOR_TYPES)

    def accelerator_types_list(self, call: Call) -> Json:
        return self._zonal_list(call, _ACCELERATOR_TYPES)

    def _zonal_get(self, call: Call, types: _ZonalTypes[_T]) -> Json:
        name = call.params[types.parameter]
        found = next((t for t in types.offered(call.zone) if t.name == name), None)
        if found is None:
            raise not_found(f"projects/{call.project}/zones/{call.zone}/{types.collection}/{name}")
        return types.resource(self.base, call.project, call.zone, found)

    def _zonal_list(self, call: Call, types: _ZonalTypes[_T]) -> Json:
        offered = sorted(types.offered(call.zone), key=lambda t: t.name)
        items = [types.resource(self.base, call.project, call.zone, t) for t in offered]
        list_id = f"projects/{call.project}/zones/{call.zone}/{types.collection}"
        return list_response(self.base, call.query, types.list_kind, list_id, items)

    def images_get(self, call: Call) -> Json:
        image = catalog.find_image(call.project, call.params["image"])
        if image is None:
            raise not_found(f"projects/{call.project}/global/images/{call.params['image']}")
        return catalog.image_resource(self.base, image)

    def images_get_from_family(self, call: Call) -> Json:
        image = catalog.image_from_family(call.project, call.params["family"])
        if image is None:
            raise not_found(f"projects/{call.project}/global/images/family/{call.params['family']}")
        return catalog.image_resource(self.base, image)

    def images_list(self, call: Call) -> Json:
        items = [catalog.image_resource(self.base, i) for i in catalog.IMAGES if i.project == call.project]
        return list_response(
            self.base, call.query, "compute#imageList", f"projects/{call.project}/global/images", items
        )

    def networks_get(self, call: Call) -> Json:
        if call.params["network"] != "default":
            raise not_found(f"projects/{call.project}/global/networks/{call.params['network']}")
        return catalog.network_resource(self.base, call.project)

    def networks_list(self, call: Call) -> Json:
        return list_response(
            self.base,
            call.query,
            "compute#networkList",
            f"projects/{call.project}/global/networks",
            [catalog.network_resource(self.base, call.project)],
        )

    def _quota_usage(self, project: str) -> tuple[ProjectSettings, Counter[QuotaKey]]:
        """The project's settings and what its instances use of each quota."""
        with self.store.lock:
            settings = self.store.settings_for(project)
            records = self.store.sorted_instances(project)
            return settings, quotas.usage(records, settings, self.store.disk_types)

    def _region_resource(
        self, project: str, region: str, settings: ProjectSettings, used: Counter[QuotaKey]
    ) -> Json:
        region_quotas = quotas.region_quotas(settings, used, region)
        return quotas.region_resource(self.base, project, region, region_quotas)

    def regions_get(self, call: Call) -> Json:
        settings, used = self._quota_usage(call.project)
        return self._region_resource(call.project, call.params["region"], settings, used)

    def regions_list(self, call: Call) -> Json:
        settings, used = self._quota_usage(call.project)
        items = [self._region_resource(call.project, r, settings, used) for r in quotas.REGIONS]
        list_id = f"projects/{call.project}/regions"
        return list_response(self.base, call.query, "compute#regionList", list_id, items)

    def projects_get(self, call: Call) -> Json:
        resource = catalog.project_resource(self.base, call.project)
        settings, used = self._quota_usage(call.project)
        used[("global", "FIREWALLS")] = len(self.store.firewalls.get(call.project, {}))
        used[("global", "NETWORKS")] = 1  # the auto-mode `default` network every project has
        resource["quotas"] = quotas.project_quotas(settings, used)
        return resource
