"""The `instances.*` methods: listing, the status lifecycle, fingerprinted updates.

Each mutation validates and records what it can at request time (so errors are synchronous,
as on Google), then hands the slow part (status steps, the backend) to an operation worker.
Operations on one instance run one after the other, like Google's per-resource queue.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import catalog, quotas
from .errors import ApiError, already_exists, not_found, required_field
from .filters import compile_filter
from .instances import (
    build_instance,
    check_labels,
    check_metadata,
    check_tags,
    fingerprint,
    now,
    request_valid_for_s,
)
from .listing import ordered, page_bounds
from .operations import ApiBase, Call, InstanceBackend, OperationFailed
from .schema import methods
from .state import InstanceRecord

Json = dict[str, Any]


class InstanceMethods(ApiBase):
    """instances.aggregatedList/list/get/insert/delete/start/stop/setLabels/setMetadata/setTags."""

    def _record(self, call: Call) -> InstanceRecord:
        record = self.store.instance(call.project, call.zone, call.params["instance"])
        if record is None:
            raise not_found(f"projects/{call.project}/zones/{call.zone}/instances/{call.params['instance']}")
        return record

    def _set_status(self, record: InstanceRecord, status: str, **fields: Any) -> None:
        with self.store.changed:
            record.data["status"] = status
            record.data.update(fields)
            self.store.touch(record)
            self.store.mark_dirty()
            self.store.changed.notify_all()

    def _operate(self, call: Call, op_type: str) -> tuple[InstanceRecord, Json]:
        """The instance the call names, and a new zonal operation of `op_type` on it."""
        record = self._record(call)
        return record, self._instance_operation(call, op_type, record)

    def _instance_operation(self, call: Call, op_type: str, record: InstanceRecord) -> Json:
        """A new zonal operation of `op_type` whose target is the instance."""
        data = record.data
        return self._new_operation(call, f"zones/{call.zone}", op_type, data["selfLink"], data["id"])

    def _boot(
        self,
        call: Call,
        record: InstanceRecord,
        boot: Callable[[InstanceBackend, Json], str | None],
        undo: Callable[[], None],
    ) -> None:
        """What insert and start share: STAGING, the backend's `boot` (it returns the VM's address, or
        None), RUNNING with the addresses. An injected error, or a boot that raises, runs `undo` and
        fails the operation."""
        self._set_status(record, "STAGING")
        error = call.fault("error")
        if error is not None:
            undo()
            raise self._fail_from_fault(error, call)
        address = None
        if self.backend is not None:
            try:
                address = boot(self.backend, self._snapshot(record))
            except Exception:
                undo()
                raise
        self._sleep()
        self._assign_ips(record, address)
        self._set_status(record, "RUNNING", lastStartTimestamp=now())
        self._schedule_end(record)

    def _schedule_end(self, record: InstanceRecord) -> None:
        """A VM with a max run duration (every Flex-start VM) ends then: Google performs its
        termination action, STOP or DELETE, and says when in resourceStatus.scheduling."""
        scheduling = record.data.get("scheduling") or {}
        seconds = int((scheduling.get("maxRunDuration") or {}).get("seconds") or 0)
        if seconds <= 0:
            return
        started = record.data.get("lastStartTimestamp")
        ends = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
        with self.store.lock:
            status = record.data.setdefault("resourceStatus", {})
            ends_text = ends.isoformat(timespec="milliseconds")
            status.setdefault("scheduling", {})["terminationTimestamp"] = ends_text
            self.store.touch(record)

        def end() -> None:
            with record.op_lock:
                current = self.store.instance(record.project, record.zone, record.name)
                if current is not record or record.data.get("lastStartTimestamp") != started:
                    return  # deleted, or stopped and started again since: that start has its own end
                if record.data.get("status") != "RUNNING":
                    return
                self._end_of_run(record)

        timer = threading.Timer(seconds, end)
        timer.daemon = True
        timer.start()

    def _end_of_run(self, record: InstanceRecord) -> None:
        """The max run duration is over: STOP (TERMINATED, the disk kept) or DELETE, as asked."""
        action = (record.data.get("scheduling") or {}).get("instanceTerminationAction") or "STOP"
        self._set_status(record, "STOPPING")
        if action == "DELETE":
            if self.backend is not None:
                self.backend.delete(self._snapshot(record))
            self.store.remove_instance(record)
            with self.store.changed:
                self.store.changed.notify_all()
            return
        if self.backend is not None:
            self.backend.stop(self._snapshot(record))
        self._release_public_ips(record)
        self._set_status(record, "TERMINATED", lastStopTimestamp=now())

    def _snapshot(self, record: InstanceRecord) -> Json:
        with self.store.lock:
            return copy.deepcopy(record.data)

    def _assign_ips(self, record: InstanceRecord, address: str | None) -> None:
        with self.store.lock:
            for index, nic in enumerate(record.data.get("networkInterfaces", [])):
                if address and index == 0:
                    nic["networkIP"] = address
                for config in nic.get("accessConfigs", []):
                    config["natIP"] = address if address and index == 0 else self.store.public_ip()
            self.store.touch(record)

    def _release_public_ips(self, record: InstanceRecord) -> None:
        """Ephemeral external addresses go back to the pool when an instance stops."""
        with self.store.lock:
            for nic in record.data.get("networkInterfaces", []):
                for config in nic.get("accessConfigs", []):
                    config.pop("natIP", None)
            self.store.touch(record)

    def _instance_page(
        self, call: Call, records: list[InstanceRecord]
    ) -> tuple[list[InstanceRecord], str | None]:
        expression = call.query.get("filter", "")
        if expression or call.query.get("orderBy"):
            predicate = compile_filter(expression)
            # Paging through a filtered listing evaluates the filter once, not once per page.
            key = (
                call.method.id,
                call.project,
                call.params.get("zone"),
                expression,
                call.query.get("orderBy"),
            )
            with self.store.lock:
                matching = self.store.cached_query(key)
                if matching is None:
                    matching = ordered(
                        call.query, [r for r in records if predicate(r.data)], lambda r: r.data
                    )
                    self.store.cache_query(key, matching)
        else:
            matching = records
        start, end, token = page_bounds(call.query, len(matching))
        return matching[start:end], token

    def instances_aggregated_list(self, call: Call) -> bytes:
        page, token = self._instance_page(call, self.store.sorted_instances(call.project))
        by_zone: dict[str, list[bytes]] = {}
        with self.store.lock:
            for record in page:
                by_zone.setdefault(record.zone, []).append(record.encoded())
        list_id = f"projects/{call.project}/aggregated/instances"
        scopes: list[bytes] = []
        for zone in sorted(set(catalog.ZONES) | set(by_zone)):
            key = json.dumps(f"zones/{zone}").encode()
            if zone in by_zone:
                scopes.append(key + b':{"instances":[' + b",".join(by_zone[zone]) + b"]}")
            else:
                warning = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope 'zones/{zone}' on this page.",
                        "data": [{"key": "scope", "value": f"zones/{zone}"}],
                    }
                }
                scopes.append(key + b":" + json.dumps(warning, separators=(",", ":")).encode())
        head = {"kind": "compute#instanceAggregatedList", "id": list_id, "selfLink": f"{self.base}{list_id}"}
        if token:
            head["nextPageToken"] = token
        return json.dumps(head).encode()[:-1] + b',"items":{' + b",".join(scopes) + b"}}"

    def instances_list(self, call: Call) -> bytes:
        records = [r for r in self.store.sorted_instances(call.project) if r.zone == call.zone]
        page, token = self._instance_page(call, records)
        list_id = f"projects/{call.project}/zones/{call.zone}/instances"
        head: Json = {"kind": "compute#instanceList", "id": list_id, "selfLink": f"{self.base}{list_id}"}
        if token:
            head["nextPageToken"] = token
        if not page:
            return json.dumps(head).encode()
        with self.store.lock:
            items = b",".join(r.encoded() for r in page)
        return json.dumps(head).encode()[:-1] + b',"items":[' + items + b"]}"

    def instances_get(self, call: Call) -> bytes:
        record = self._record(call)
        with self.store.lock:
            return record.encoded()

    def _over_quota(self, call: Call, instance: Json, disk_types: list[str]) -> str | None:
        """Google's QUOTA_EXCEEDED message if the new instance would pass one of the project's
        limits (quotas.py), else None. Call under the store lock."""
        settings = self.store.settings_for(call.project)
        used = quotas.usage(self.store.sorted_instances(call.project), settings, self.store.disk_types)
        return quotas.exceeded(settings, used, quotas.charges(instance, call.zone, settings, disk_types))

    def instances_insert(self, call: Call) -> Json:
        body = call.body or {}
        disk_types = quotas.disk_types(body)
        instance = build_instance(body, call.project, call.zone, self.base)
        if body.get("resourcePolicies"):
            instance["resourcePolicies"] = self.instance_resource_policies(body, call.project, call.zone)
        with self.store.lock:
            existing = self.store.instance(call.project, call.zone, instance["name"])
            if existing is not None:
                raise already_exists(
                    f"projects/{call.project}/zones/{call.zone}/instances/{instance['name']}"
                )
            instance = {"kind": instance.pop("kind"), "id": self.store.next_id(), **instance}
            for nic in instance["networkInterfaces"]:
                nic["networkIP"] = self.store.private_ip(call.zone)
            over_quota = self._over_quota(call, instance, disk_types)
            record = InstanceRecord(call.project, call.zone, instance)
            self.store.disk_types[instance["id"]] = disk_types
            self.store.put_instance(record)
        op = self._new_operation(call, f"zones/{call.zone}", "insert", instance["selfLink"], instance["id"])

        def create(backend: InstanceBackend, instance: Json) -> str | None:
            try:
                return backend.create(instance)
            except Exception as exc:
                raise OperationFailed(
                    "INTERNAL_ERROR", f"The sandbox backend could not create it: {exc}", 500
                ) from exc

        def work() -> None:
            self._sleep()
            if over_quota:  # Google fails the operation, and no instance is left
                self.store.remove_instance(record)
                raise OperationFailed("QUOTA_EXCEEDED", over_quota, 403)
            self._boot(call, record, create, undo=lambda: self.store.remove_instance(record))

        if instance["status"] == "PENDING":  # Flex-start: queued for capacity, deletable meanwhile
            wait_s = self.store.settings_for(call.project).flex_start_wait_s
            valid_s = request_valid_for_s(body)

            def queued() -> None:
                if not self._wait_for_capacity(record, min(wait_s, valid_s)):
                    return  # deleted while it waited: the request is withdrawn
                if wait_s > valid_s:
                    self.store.remove_instance(record)
                    raise OperationFailed(
                        "ZONE_RESOURCE_POOL_EXHAUSTED",
                        f"The zone 'projects/{call.project}/zones/{call.zone}' did not have enough "
                        f"resources for the Flex-start request within its {valid_s} s "
                        "(requestValidForDuration). Try again later, or in a different zone.",
                        503,
                    )
                with record.op_lock:
                    self._set_status(record, "PROVISIONING")
                    work()

            return self._launch(call, op, self._then_sync_firewalls(call.project, queued))
        # The instance's address changes: rules whose sources are tags follow it.
        return self._launch(call, op, self._then_sync_firewalls(call.project, work), record)

    def _wait_for_capacity(self, record: InstanceRecord, seconds: float) -> bool:
        """Hold a Flex-start request PENDING for `seconds` (the project's `flex_start_wait_s`);
        False when the instance was deleted meanwhile."""
        deadline = time.monotonic() + seconds
        gone = lambda: self.store.instance(record.project, record.zone, record.name) is not record  # noqa: E731
        while time.monotonic() < deadline:
            if self.store.wait_for(gone, max(0.0, deadline - time.monotonic())):
                return False
        return not gone()

    def instances_delete(self, call: Call) -> Json:
        record = self._record(call)
        if record.data.get("deletionProtection"):
            raise ApiError(
                400,
                "Invalid resource usage: 'Resource cannot be deleted if it's protected against deletion.'.",
                "resourceInUseByAnotherResource",
            )
        op = self._instance_operation(call, "delete", record)

        def work() -> None:
            self._require_present(call, record)
            self._raise_injected(call)
            queued = record.data["status"] == "PENDING"  # a Flex-start request: no host was made yet
            self._set_status(record, "STOPPING")
            if self.backend is not None and not queued:
                self.backend.delete(self._snapshot(record))
            self._sleep()
            self.store.remove_instance(record)
            with self.store.changed:
                self.store.changed.notify_all()

        # The instance's address changes: rules whose sources are tags follow it.
        return self._launch(call, op, self._then_sync_firewalls(call.project, work), record)

    def instances_start(self, call: Call) -> Json:
        record, op = self._operate(call, "start")

        def work() -> None:
            self._require_present(call, record)
            if record.data["status"] == "RUNNING":
                return
            self._boot(
                call,
                record,
                lambda backend, instance: backend.start(instance),
                undo=lambda: self._set_status(record, "TERMINATED"),
            )

        # The instance's address changes: rules whose sources are tags follow it.
        return self._launch(call, op, self._then_sync_firewalls(call.project, work), record)

    def instances_stop(self, call: Call) -> Json:
        record, op = self._operate(call, "stop")

        def work() -> None:
            self._require_present(call, record)
            if record.data["status"] in ("TERMINATED", "STOPPED"):
                return
            self._raise_injected(call)
            self._set_status(record, "STOPPING")
            if self.backend is not None:
                try:
                    self.backend.stop(self._snapshot(record))
                except Exception:
                    self._set_status(record, "RUNNING")
                    raise
            self._sleep()
            self._release_public_ips(record)
            self._set_status(record, "TERMINATED", lastStopTimestamp=now())

        return self._launch(call, op, work, record)

    def preempt(self, project: str, zone: str, name: str) -> Json:
        """Google preempting a Spot VM: a system operation, then STOP (TERMINATED) or DELETE."""
        record = self.store.instance(project, zone, name)
        if record is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        if not record.data.get("scheduling", {}).get("preemptible"):
            raise ValueError(f"{name} is not a Spot/preemptible instance")
        with record.op_lock:
            return self._preempt_locked(record, project, zone)

    def _preempt_locked(self, record: InstanceRecord, project: str, zone: str) -> Json:
        """The preemption itself; the caller holds the instance's op_lock."""
        # Google itself acts here; the operation is filed as if it stopped the instance.
        system = methods()["compute.instances.stop"]
        call = Call(system, {"project": project, "zone": zone}, {}, None, "system")
        link, target = record.data["selfLink"], record.data["id"]
        op = self._new_operation(call, f"zones/{zone}", "compute.instances.preempted", link, target)
        action = record.data["scheduling"].get("instanceTerminationAction", "STOP")
        self._update_op(op, status="RUNNING", startTime=now())
        self._set_status(record, "STOPPING")
        if action == "DELETE":
            if self.backend is not None:
                self.backend.delete(self._snapshot(record))
            self.store.remove_instance(record)
        else:
            if self.backend is not None:
                self.backend.stop(self._snapshot(record))
            self._release_public_ips(record)
            self._set_status(record, "TERMINATED", lastStopTimestamp=now())
        self._update_op(op, status="DONE", endTime=now(), progress=100)
        return copy.deepcopy(op)

    def instances_simulate_maintenance_event(self, call: Call) -> Json:
        """A simulated host maintenance event, as Google documents it for testing Spot VMs.

        A Spot VM is preempted (its own `compute.instances.preempted` system operation, then STOP
        or DELETE): this is how forja's drills take a VM away on purpose, through the public API.
        A standard VM with a GPU cannot live-migrate (onHostMaintenance TERMINATE): it stops and,
        with automaticRestart (the default), starts again. A VM that can migrate keeps running.
        """
        record, op = self._operate(call, "simulateMaintenanceEvent")

        def work() -> None:
            self._require_present(call, record)
            if record.data["status"] != "RUNNING":
                raise OperationFailed(
                    "UNSUPPORTED_OPERATION",
                    f"The instance '{record.name}' must be RUNNING to simulate a maintenance event",
                    400,
                )
            scheduling = record.data.get("scheduling", {})
            if scheduling.get("preemptible"):
                self._preempt_locked(record, call.project, call.zone)
                return
            if scheduling.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
                return  # live migration: the guest notices nothing
            self._set_status(record, "STOPPING")
            if self.backend is not None:
                self.backend.stop(self._snapshot(record))
            self._release_public_ips(record)
            self._set_status(record, "TERMINATED", lastStopTimestamp=now())
            if scheduling.get("automaticRestart", True):
                self._set_status(record, "STAGING")
                address = self.backend.start(self._snapshot(record)) if self.backend is not None else None
                self._assign_ips(record, address)
                self._set_status(record, "RUNNING", lastStartTimestamp=now())

        return self._launch(call, op, work, record)

    def guest_powered_off(self, instance: Json) -> bool:
        project = instance["selfLink"].split("/projects/", 1)[1].split("/", 1)[0]
        zone = instance["zone"].rsplit("/", 1)[-1]
        record = self.store.instance(project, zone, instance["name"])
        if record is None or not record.op_lock.acquire(blocking=False):
            return False
        try:
            if record.data["status"] != "RUNNING":
                return False
            self._release_public_ips(record)
            self._set_status(record, "TERMINATED", lastStopTimestamp=now())
            return True
        finally:
            record.op_lock.release()

    def _require_present(self, call: Call, record: InstanceRecord) -> None:
        if self.store.instance(call.project, call.zone, record.name) is not record:
            raise OperationFailed(
                "RESOURCE_NOT_FOUND", f"The resource '{record.data['selfLink']}' was not found", 404
            )

    def instances_set_labels(self, call: Call) -> Json:
        record, body = self._fingerprinted(call, "labelFingerprint")
        labels = body.get("labels") or {}
        check_labels("resource.labels", labels)
        stale = "Labels fingerprint either invalid or resource labels have changed"
        with self._replacing(record, body["labelFingerprint"], stale, "labelFingerprint") as data:
            if labels:
                data["labels"] = dict(labels)
            else:
                data.pop("labels", None)
            data["labelFingerprint"] = fingerprint(labels)
        op = self._instance_operation(call, "setLabels", record)
        return self._launch(call, op, self._maybe_fail(call), record)

    def instances_set_metadata(self, call: Call) -> Json:
        record, body = self._fingerprinted(call, "fingerprint")
        items = check_metadata("resource", body)
        stale = "Supplied fingerprint does not match current metadata fingerprint."
        with self._replacing(record, body["fingerprint"], stale, "metadata", "fingerprint") as data:
            data["metadata"] = {"kind": "compute#metadata", "fingerprint": fingerprint(items)}
            if items:
                data["metadata"]["items"] = items
        op = self._instance_operation(call, "setMetadata", record)
        return self._launch(call, op, self._maybe_fail(call), record)

    def instances_set_tags(self, call: Call) -> Json:
        record, body = self._fingerprinted(call, "fingerprint")
        items = list(body.get("items") or [])
        check_tags("resource.items", items)
        stale = "Supplied fingerprint does not match current tags fingerprint."
        with self._replacing(record, body["fingerprint"], stale, "tags", "fingerprint") as data:
            data["tags"] = {"items": items} if items else {}
            data["tags"]["fingerprint"] = fingerprint(items)
        op = self._instance_operation(call, "setTags", record)
        # Tags choose which firewall rules apply to the instance (targetTags).
        return self._launch(call, op, self._then_sync_firewalls(call.project, self._maybe_fail(call)), record)

    def _fingerprinted(self, call: Call, key: str) -> tuple[InstanceRecord, Json]:
        """The instance a fingerprinted update (setLabels, setMetadata, setTags) names, and the update's
        body, which must carry `key`: the fingerprint of what it replaces."""
        record = self._record(call)
        body = call.body or {}
        if key not in body:
            raise required_field(f"resource.{key}")
        return record, body

    @contextlib.contextmanager
    def _replacing(self, record: InstanceRecord, given: Any, stale: str, *path: str) -> Iterator[Json]:
        """Under the lock: unless `given` is still the fingerprint at `path` in the instance's data, 412
        conditionNotMet in the method's words (`stale`); else the block changes the data, then the
        instance is touched."""
        with self.store.lock:
            current = functools.reduce(lambda node, key: (node or {}).get(key), path, record.data)
            if given != current:
                raise ApiError(412, stale, "conditionNotMet")
            yield record.data
            self.store.touch(record)
