"""Guest attributes: small values a VM writes to its metadata server, read through the Compute API.

On GCE a process on the VM writes `PUT /computeMetadata/v1/instance/guest-attributes/NS/KEY` (no
credentials: the metadata server knows which VM calls), and anyone with compute access reads them
with `instances.getGuestAttributes` (`variableKey=NS/KEY` or `queryPath=NS/`), whether the VM runs
or not. Writes are refused (403) unless the instance's metadata has `enable-guest-attributes=TRUE`.
forja's autostop agent records why it stopped a VM this way.

The attributes are kept beside the instance resource, never inside it (GCE does not return them
from `instances.get`), and are dropped with the instance.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import ApiError, invalid_field, not_found
from .operations import ApiBase, Call
from .state import InstanceRecord

Json = dict[str, Any]

#: The metadata key that turns guest attributes on (instance metadata; project metadata is not emulated).
ENABLE_KEY = "enable-guest-attributes"
#: Namespaces and keys: letters, digits, '-' and '_' (what GCE's own agents use).
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class GuestAttributeError(Exception):
    """A refused guest write: the HTTP status and the text the metadata server answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def enabled(record: InstanceRecord) -> bool:
    """Whether the instance's own metadata turns guest attributes on (the value is case-insensitive)."""
    items = (record.data.get("metadata") or {}).get("items") or []
    values = {item.get("key"): str(item.get("value", "")) for item in items}
    return values.get(ENABLE_KEY, "").strip().upper() == "TRUE"


class GuestAttributeMethods(ApiBase):
    """`instances.getGuestAttributes`, and the guest's side that the metadata server calls."""

    # -- the guest's side (metadata server) ----------------------------------------------------
    def instance_at(self, address: str) -> InstanceRecord | None:
        """The RUNNING instance whose first interface has this address (the caller of the metadata server)."""
        with self.store.lock:
            for record in self.store.all_instances():
                nics = record.data.get("networkInterfaces") or [{}]
                if record.data.get("status") == "RUNNING" and nics[0].get("networkIP") == address:
                    return record
        return None

    def put_guest_attribute(self, record: InstanceRecord, namespace: str, key: str, value: str) -> None:
        if not enabled(record):
            raise GuestAttributeError(403, f"Guest attributes are disabled: set the metadata key {ENABLE_KEY}"
                                           "=TRUE on the instance.")
        for what, name in (("namespace", namespace), ("key", key)):
            if not NAME.match(name):
                raise GuestAttributeError(400, f"Invalid guest attribute {what} {name!r}.")
        with self.store.lock:
            self.store.guest_attributes.setdefault(str(record.data["id"]), {})[f"{namespace}/{key}"] = value
            self.store.mark_dirty()

    def guest_attribute(self, record: InstanceRecord, namespace: str, key: str) -> str | None:
        with self.store.lock:
            return self.store.guest_attributes.get(str(record.data["id"]), {}).get(f"{namespace}/{key}")

    def delete_guest_attribute(self, record: InstanceRecord, namespace: str, key: str) -> bool:
        with self.store.lock:
            values = self.store.guest_attributes.get(str(record.data["id"]), {})
            found = values.pop(f"{namespace}/{key}", None)
            self.store.mark_dirty()
        return found is not None

    # -- the API's side ------------------------------------------------------------------------
    def instances_get_guest_attributes(self, call: Call) -> Json:
        """`variableKey=NS/KEY` answers one value (404 when unset); `queryPath=NS/` lists a namespace."""
        record = self.store.instance(call.project, call.zone, call.params["instance"])
        link = f"projects/{call.project}/zones/{call.zone}/instances/{call.params['instance']}"
        if record is None:
            raise not_found(link)
        with self.store.lock:
            values = dict(self.store.guest_attributes.get(str(record.data["id"]), {}))
        self_link = f"{self.base}{link}/getGuestAttributes"
        key = call.query.get("variableKey")
        if key:
            if key not in values:
                raise not_found(f"{link}/guestAttributes/{key}")
            return {"kind": "compute#guestAttributes", "variableKey": key, "variableValue": values[key],
                    "selfLink": self_link}
        path = call.query.get("queryPath", "")
        if path and not path.endswith("/") and path not in values:
            raise invalid_field("queryPath", path, "give a namespace ending in '/' or a NAMESPACE/KEY")
        items = []
        for full, value in sorted(values.items()):
            if full == path or full.startswith(path):
                namespace, name = full.split("/", 1)
                items.append({"namespace": namespace, "key": name, "value": value})
        if not items and path:
            raise not_found(f"{link}/guestAttributes/{path}")
        return {"kind": "compute#guestAttributes", "queryPath": path, "queryValue": {"items": items},
                "selfLink": self_link}


__all__ = ["ENABLE_KEY", "ApiError", "GuestAttributeError", "GuestAttributeMethods"]
