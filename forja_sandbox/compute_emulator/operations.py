"""Operations: how a mutation answers at once and finishes on a worker thread.

A mutation returns an Operation (PENDING); a worker thread then runs its work (RUNNING) and
records the outcome (DONE, with `error` on failure, which is how Google reports stock-outs and
quota errors). `ApiBase` holds what every method group needs: the store, the fault rules, the
backend and this plumbing; the operation read methods live here too.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import catalog
from .errors import not_found
from .faults import Fault, Faults
from .instances import now
from .listing import list_response
from .schema import Method
from .state import InstanceRecord, Store

Json = dict[str, Any]
MAX_OPERATIONS = 20_000


class InstanceBackend(Protocol):
    """Binds emulated instances to something real (the sandbox: local test hosts).

    Called from the operation worker, never from the HTTP thread. `create`/`start` return the
    address to publish as networkIP/natIP (None: the emulator invents one). An exception makes
    the operation end DONE with an error.

    Optional: `firewalls_changed(project, firewalls, instances)` (a backend that enforces the
    firewall, like the sandbox's) gets copies of the project's stored Firewalls and of its
    instances whenever what decides a host's firewall changes: on the worker of every firewall
    insert/patch/delete and of `setTags`, and for every project when the emulator starts or the
    backend is attached (so rules loaded from a state file reach hosts that are already up).
    """

    def create(self, instance: Json) -> str | None: ...

    def start(self, instance: Json) -> str | None: ...

    def stop(self, instance: Json) -> None: ...

    def delete(self, instance: Json) -> None: ...


class Loopback:
    """A backend whose every instance is reached at 127.0.0.1: for tests that play each VM's guest
    themselves (its metadata server, its SSH), with no test host behind it."""

    def create(self, instance: Json) -> str:
        return "127.0.0.1"

    def start(self, instance: Json) -> str:
        return "127.0.0.1"

    def stop(self, instance: Json) -> None:
        return None

    def delete(self, instance: Json) -> None:
        return None


@dataclasses.dataclass
class Call:
    method: Method
    params: dict[str, str]
    query: dict[str, Any]
    body: Any
    principal: str
    faults: list[Fault] = dataclasses.field(default_factory=list)

    @property
    def project(self) -> str:
        return self.params["project"]

    @property
    def zone(self) -> str:
        return self.params["zone"]

    def fault(self, kind: str) -> Fault | None:
        for fault in self.faults:
            if (kind == "error" and fault.error) or (kind == "delay" and fault.delay_s):
                return fault
        return None


class OperationFailed(Exception):
    """Ends an operation DONE with `error` (Google's way to report asynchronous failures)."""

    def __init__(self, code: str, message: str, http_status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status


_HTTP_MESSAGES = {
    400: "BAD REQUEST",
    403: "FORBIDDEN",
    404: "NOT FOUND",
    409: "CONFLICT",
    500: "INTERNAL SERVER ERROR",
    503: "SERVICE UNAVAILABLE",
}


class ApiBase:
    """State and operation plumbing shared by the method groups."""

    def __init__(
        self,
        store: Store,
        faults: Faults,
        base_url: Callable[[], str],
        backend: InstanceBackend | None = None,
        operation_delay_s: float = 0.0,
        wait_timeout_s: float = 120.0,
    ) -> None:
        self.store = store
        self.faults = faults
        self._base_url = base_url
        self.backend = backend
        self.operation_delay_s = operation_delay_s
        self.wait_timeout_s = wait_timeout_s
        self._firewall_sync = threading.Lock()

    @property
    def base(self) -> str:
        return self._base_url()

    def _project_url(self, project: str) -> str:
        return f"{self.base}projects/{project}"

    def _sleep(self, extra: float = 0.0) -> None:
        if self.operation_delay_s + extra > 0:
            time.sleep(self.operation_delay_s + extra)

    @staticmethod
    def _op_key(op: Json) -> tuple[str, str, str]:
        path = op["selfLink"].split("/projects/", 1)[1].split("/")
        return path[0], "/".join(path[1:-2]), op["name"]

    def _new_operation(self, call: Call, scope: str, op_type: str, target_link: str, target_id: str) -> Json:
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}"
        project_url = self._project_url(call.project)
        op: Json = {
            "kind": "compute#operation",
            "id": self.store.next_id(),
            "name": name,
            "operationType": op_type,
            "targetLink": target_link,
            "targetId": target_id,
            "status": "PENDING",
            "user": call.principal,
            "progress": 0,
            "insertTime": now(),
            "selfLink": f"{project_url}/{scope}/operations/{name}",
        }
        if scope.startswith("zones/"):
            op["zone"] = f"{project_url}/{scope}"
        elif scope.startswith("regions/"):
            op["region"] = f"{project_url}/{scope}"
        with self.store.lock:
            self.store.operations[(call.project, scope, name)] = op
            if len(self.store.operations) > MAX_OPERATIONS:
                self._forget_oldest_done_operations()
            self.store.mark_dirty()
        return op

    def _forget_oldest_done_operations(self) -> None:
        """Keep a long-running emulator's memory bounded (Google also expires old operations)."""
        excess = len(self.store.operations) - MAX_OPERATIONS // 2
        for key in [k for k, op in self.store.operations.items() if op["status"] == "DONE"][:excess]:
            del self.store.operations[key]

    def _launch(
        self, call: Call, op: Json, work: Callable[[], None], record: InstanceRecord | None = None
    ) -> Json:
        """Run `work` on a worker thread: op RUNNING after the delay, DONE (maybe with error) after."""
        delay = call.fault("delay")
        extra = delay.delay_s if delay else 0.0

        def worker() -> None:
            guard = record.op_lock if record is not None else contextlib.nullcontext()
            with guard:
                self._sleep(extra)
                self._update_op(op, status="RUNNING", startTime=now(), progress=0)
                failure: OperationFailed | None = None
                try:
                    work()
                except OperationFailed as exc:
                    failure = exc
                except Exception as exc:  # a backend or emulator bug: report it on the operation
                    failure = OperationFailed(
                        "INTERNAL_ERROR", f"Internal error: {type(exc).__name__}: {exc}", 500
                    )
                changes: Json = {"status": "DONE", "endTime": now(), "progress": 100}
                if failure is not None:
                    changes["error"] = {"errors": [{"code": failure.code, "message": failure.message}]}
                    changes["httpErrorStatusCode"] = failure.http_status
                    changes["httpErrorMessage"] = _HTTP_MESSAGES.get(failure.http_status, "ERROR")
                self._update_op(op, **changes)

        with self.store.lock:
            answer = copy.deepcopy(op)
        threading.Thread(target=worker, name=f"op-{op['name']}", daemon=True).start()
        return answer

    def _update_op(self, op: Json, **changes: Any) -> None:
        with self.store.changed:
            op.update(changes)
            self.store.mark_dirty()
            self.store.changed.notify_all()

    def sync_firewalls(self, project: str | None = None) -> None:
        """Give the backend's optional `firewalls_changed` the project's (or every project's) rules.

        The copies are taken under one lock and handed over under it, so whatever order the
        workers of two quick changes run in, the backend is left with the newest rules.
        """
        hook = getattr(self.backend, "firewalls_changed", None)
        if hook is None:
            return
        with self.store.lock:
            projects = [project] if project is not None else sorted(self.store.projects)
        for name in projects:
            with self._firewall_sync:
                with self.store.lock:
                    firewalls = copy.deepcopy(list(self.store.firewalls.get(name, {}).values()))
                    instances = [copy.deepcopy(r.data) for r in self.store.sorted_instances(name)]
                hook(name, firewalls, instances)

    def _then_sync_firewalls(self, project: str, work: Callable[[], None]) -> Callable[[], None]:
        """`work`, then `sync_firewalls(project)` even if it failed (hosts follow the stored state)."""

        def run() -> None:
            try:
                work()
            finally:
                self.sync_firewalls(project)

        return run

    def _fail_from_fault(self, fault: Fault, call: Call) -> OperationFailed:
        """The operation error an `error=` fault stands for, naming the caller's project and zone."""
        zone = call.params.get("zone", "global")
        status, error = fault.operation_error(
            f"projects/{call.project}/zones/{zone}", catalog.ZONES.get(zone, zone)
        )
        first = error["errors"][0]  # type: ignore[index]
        return OperationFailed(first["code"], first["message"], status)

    def _raise_injected(self, call: Call) -> None:
        """Fail the operation as the call's injected `error=` fault says, if it has one."""
        error = call.fault("error")
        if error is not None:
            raise self._fail_from_fault(error, call)

    def _maybe_fail(self, call: Call) -> Callable[[], None]:
        def work() -> None:
            self._sleep()
            self._raise_injected(call)

        return work

    @staticmethod
    def _operation_scope(call: Call) -> str:
        if "zone" in call.params:
            return f"zones/{call.params['zone']}"
        if "region" in call.params:
            return f"regions/{call.params['region']}"
        return "global"

    def _operation(self, call: Call) -> Json:
        scope = self._operation_scope(call)
        op = self.store.operations.get((call.project, scope, call.params["operation"]))
        if op is None:
            raise not_found(f"projects/{call.project}/{scope}/operations/{call.params['operation']}")
        return op

    def operations_get(self, call: Call) -> Json:
        with self.store.lock:
            return copy.deepcopy(self._operation(call))

    def operations_wait(self, call: Call) -> Json:
        op = self._operation(call)
        self.store.wait_for(lambda: op["status"] == "DONE", self.wait_timeout_s)
        with self.store.lock:
            return copy.deepcopy(op)

    def operations_list(self, call: Call) -> Json:
        scope = self._operation_scope(call)
        with self.store.lock:
            ops = [
                copy.deepcopy(op)
                for (p, s, _n), op in self.store.operations.items()
                if p == call.project and s == scope
            ]
        return list_response(
            self.base, call.query, "compute#operationList", f"projects/{call.project}/{scope}/operations", ops
        )

    def operations_delete(self, call: Call) -> Json:
        scope = self._operation_scope(call)
        with self.store.lock:
            self._operation(call)
            del self.store.operations[(call.project, scope, call.params["operation"])]
            self.store.mark_dirty()
        return {}
