"""Firewalls (global, with global operations) and the read-only catalog methods."""

from __future__ import annotations

import copy
from typing import Any

from . import catalog
from .errors import already_exists, invalid_field, not_found
from .firewalls import build_firewall
from .listing import list_response
from .operations import ApiBase, Call

Json = dict[str, Any]


class ResourceMethods(ApiBase):
    """firewalls.*, zones, machineTypes, acceleratorTypes, images, networks, projects.get."""

    def _firewall(self, call: Call) -> Json:
        firewall = self.store.firewalls[call.project].get(call.params["firewall"])
        if firewall is None:
            raise not_found(f"projects/{call.project}/global/firewalls/{call.params['firewall']}")
        return firewall

    def firewalls_insert(self, call: Call) -> Json:
        firewall = build_firewall(call.body or {}, call.project, self.base, self.store.next_id())
        with self.store.lock:
            if firewall["name"] in self.store.firewalls[call.project]:
                raise already_exists(f"projects/{call.project}/global/firewalls/{firewall['name']}")
            self.store.firewalls[call.project][firewall["name"]] = firewall
            self.store.mark_dirty()
        op = self._new_operation(call, "global", "insert", firewall["selfLink"], firewall["id"])
        return self._launch(call, op, self._then_sync_firewalls(call.project, self._maybe_fail(call)))

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
        op = self._new_operation(call, "global", "patch", patched["selfLink"], patched["id"])
        return self._launch(call, op, self._then_sync_firewalls(call.project, self._maybe_fail(call)))

    def firewalls_delete(self, call: Call) -> Json:
        with self.store.lock:
            firewall = self._firewall(call)
            del self.store.firewalls[call.project][firewall["name"]]
            self.store.mark_dirty()
        op = self._new_operation(call, "global", "delete", firewall["selfLink"], firewall["id"])
        return self._launch(call, op, self._then_sync_firewalls(call.project, self._maybe_fail(call)))

    def zones_get(self, call: Call) -> Json:
        return catalog.zone_resource(self.base, call.project, call.zone)

    def zones_list(self, call: Call) -> Json:
        zones = [catalog.zone_resource(self.base, call.project, z) for z in sorted(catalog.ZONES)]
        return list_response(
            self.base, call.query, "compute#zoneList", f"projects/{call.project}/zones", zones
        )

    def machine_types_get(self, call: Call) -> Json:
        machine = catalog.MACHINE_TYPES.get(call.params["machineType"])
        if machine is None or machine not in catalog.machine_types_in(call.zone):
            raise not_found(
                f"projects/{call.project}/zones/{call.zone}/machineTypes/{call.params['machineType']}"
            )
        return catalog.machine_type_resource(self.base, call.project, call.zone, machine)

    def machine_types_list(self, call: Call) -> Json:
        items = [
            catalog.machine_type_resource(self.base, call.project, call.zone, m)
            for m in sorted(catalog.machine_types_in(call.zone), key=lambda m: m.name)
        ]
        return list_response(
            self.base,
            call.query,
            "compute#machineTypeList",
            f"projects/{call.project}/zones/{call.zone}/machineTypes",
            items,
        )

    def accelerator_types_get(self, call: Call) -> Json:
        accel = catalog.ACCELERATOR_TYPES.get(call.params["acceleratorType"])
        if accel is None or call.zone not in accel.zones:
            raise not_found(
                f"projects/{call.project}/zones/{call.zone}/acceleratorTypes/{call.params['acceleratorType']}"
            )
        return catalog.accelerator_type_resource(self.base, call.project, call.zone, accel)

    def accelerator_types_list(self, call: Call) -> Json:
        items = [
            catalog.accelerator_type_resource(self.base, call.project, call.zone, a)
            for a in sorted(catalog.accelerators_in(call.zone), key=lambda a: a.name)
        ]
        list_id = f"projects/{call.project}/zones/{call.zone}/acceleratorTypes"
        return list_response(self.base, call.query, "compute#acceleratorTypeList", list_id, items)

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

    def projects_get(self, call: Call) -> Json:
        return catalog.project_resource(self.base, call.project)
