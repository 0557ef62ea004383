"""A VM's metadata server (metadata.google.internal): its metadata, long polls, guest attributes.

On GCE every VM reaches its own metadata server at 169.254.169.254:80; the server knows the VM by
where the request comes from, and refuses requests without `Metadata-Flavor: Google` (so a page
in a browser on the VM cannot be tricked into calling it). Here one server answers every instance
of the emulator: it finds the calling instance by its source address (the RUNNING instance whose
first interface has that `networkIP`, which the sandbox's hosts do) and refuses anyone else.

What the guests read is what Google's guest agent reads: the instance's and the project's
`attributes/` (the metadata items: `ssh-keys`, `enable-oslogin`, `block-project-ssh-keys`, ...),
as text or as JSON (`?recursive=true&alt=json`), and `?wait_for_change=true` long polls that
return when the value under the path changes (`last_etag`, `timeout_sec`, an `ETag` on every
answer). That is how the sandbox's guest-agent stand-in (forja_sandbox/guest_agent) learns that
`setMetadata` granted or revoked an SSH key. With OS Login on, guests look up profiles here
(`oslogin/users?username=`, `oslogin/authorize`). Guests also write guest attributes here.

    server = MetadataServer(emulator.api, host="10.213.0.1", port=8090).start()
    # on the VM: curl -H 'Metadata-Flavor: Google' \\
    #   'http://10.213.0.1:8090/computeMetadata/v1/instance/attributes/?recursive=true&wait_for_change=true'

Metadata values are secrets (SSH keys, scripts): nothing here logs them, and no error repeats one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..emulator_http import EmulatorServer, EmulatorService, VerbHandler
from . import catalog, oslogin
from .guest_attributes import GuestAttributeError, GuestAttributeMethods
from .state import InstanceRecord

ROOT = "/computeMetadata/v1/"
PREFIX = ROOT + "instance/guest-attributes/"
#: GCE caps a guest attribute's value; 1 KiB is a safe lower bound for what forja writes.
MAX_VALUE_BYTES = 1024
#: A long poll without `timeout_sec` still ends: after this long it answers the unchanged value
#: (GCE's own cap is not documented; Google's agent asks for 60 s).
MAX_WAIT_S = 600.0
#: How often a long poll looks at the instance again (setMetadata applies at request time).
WAIT_STEP_S = 0.25


class _MetadataHTTPServer(EmulatorServer):
    """Every VM's agents poll here: the same deep accept queue as the API (not Python's 5)."""

    thread_name = "metadata-server"

    def __init__(self, address: tuple[str, int], api: GuestAttributeMethods) -> None:
        self.metadata_api = api
        #: Set on stop: long polls answer at once.
        self.stopping = threading.Event()
        super().__init__(address, _Handler)


class MetadataServer(EmulatorService):
    """A threaded HTTP server for the metadata and guest-attributes endpoints of every instance."""

    def __init__(self, api: GuestAttributeMethods, host: str = "127.0.0.1", port: int = 0) -> None:
        self.api = api
        self._server: _MetadataHTTPServer = _MetadataHTTPServer((host, port), api)
        self.host, self.port = str(self._server.server_address[0]), int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """What a VM uses instead of http://metadata.google.internal/computeMetadata/v1."""
        return f"{super().url}/computeMetadata/v1"

    def stop(self) -> None:
        self._server.stopping.set()  # long polls answer at once
        super().stop()


def _items(metadata: dict[str, Any] | None) -> dict[str, str]:
    return {str(i["key"]): str(i.get("value", "")) for i in (metadata or {}).get("items") or []}


def metadata_tree(api: GuestAttributeMethods, record: InstanceRecord) -> dict[str, Any]:
    """The calling VM's metadata as GCE's server lays it out (path names; camelCase in JSON).

    `project/attributes/` is the project's `commonInstanceMetadata`, which the emulator serves
    empty (it does not emulate `projects.setCommonInstanceMetadata`).
    """
    project = catalog.project_resource(api.base, record.project)
    with api.store.lock:
        data = record.data
        attributes = _items(data.get("metadata"))
        name, instance_id = str(data["name"]), int(data["id"])
        nics = data.get("networkInterfaces") or [{}]
        ip = str(nics[0].get("networkIP", ""))
    return {
        "instance": {
            "attributes": attributes,
            "hostname": f"{name}.{record.zone}.c.{record.project}.internal",
            "id": instance_id,
            "name": name,
            "network-interfaces": {"0": {"ip": ip}},
            "zone": f"projects/{project['id']}/zones/{record.zone}",
        },
        "project": {
            "attributes": _items(project.get("commonInstanceMetadata")),
            "numeric-project-id": int(project["id"]),
            "project-id": record.project,
        },
    }


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _as_json(node: Any, under_attributes: bool = False) -> Any:
    """GCE's recursive JSON: directory names in camelCase, attribute keys exactly as set."""
    if not isinstance(node, dict):
        return node
    return {(key if under_attributes else _camel(key)): _as_json(value, key == "attributes")
            for key, value in node.items()}


def _lookup(tree: dict[str, Any], path: str) -> tuple[bool, Any]:
    """The node at `path` (relative to /computeMetadata/v1/), and whether it was found."""
    node: Any = tree
    for part in [p for p in path.split("/") if p]:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def render(node: Any, path: str, recursive: bool, alt: str) -> tuple[str, str]:
    """(body, content type) for a node, as GCE answers: text listings, or JSON when recursive."""
    in_attributes = "/attributes/" in f"/{path}" or path.rstrip("/").endswith("attributes")
    if isinstance(node, dict):
        if recursive and alt != "text":
            body = json.dumps(_as_json(node, in_attributes), separators=(",", ":"), sort_keys=True)
            return body, "application/json"
        lines = [f"{key}/" if isinstance(value, dict) else key for key, value in sorted(node.items())]
        return "".join(line + "\n" for line in lines), "application/text"
    if alt == "json":
        return json.dumps(node), "application/json"
    return str(node), "application/text"


def etag(body: str) -> str:
    """An opaque version of one answer: a digest of what the path holds (GCE's are 16 hex digits)."""
    return hashlib.sha256(body.encode()).hexdigest()[:16]


class _Handler(VerbHandler):
    server_version = "Metadata Server for VM"
    server: _MetadataHTTPServer
    verbs = frozenset({"GET", "PUT", "DELETE"})

    def _reply(self, status: int, text: str, content_type: str = "application/text",
               tag: str | None = None) -> None:
        headers = {"Metadata-Flavor": "Google"} | ({"ETag": tag} if tag is not None else {})
        self.send_body(status, text.encode(), content_type, headers)

    def answer(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.headers.get("Metadata-Flavor") != "Google":
            self._reply(403, "Missing Metadata-Flavor:Google header.")
            return
        if self.headers.get("X-Forwarded-For"):  # GCE refuses proxied requests the same way
            self._reply(403, "Request had an X-Forwarded-For header and was refused.")
            return
        api = self.server.metadata_api
        record = api.instance_at(self.client_address[0])
        if record is None:
            self._reply(403, f"{self.client_address[0]} is not a running instance of this cloud.")
            return
        split = urlsplit(self.path)
        path = split.path
        if path.startswith(PREFIX):
            self._guest_attribute(api, record, method, path, body)
        elif method == "GET" and (path + "/").startswith(ROOT):
            self._metadata(api, record, path[len(ROOT):], parse_qs(split.query))
        else:
            self._reply(404 if method == "GET" else 405, f"{path} is not served for {method}.")

    def _metadata(self, api: GuestAttributeMethods, record: InstanceRecord, path: str,
                  query: dict[str, list[str]]) -> None:
        def arg(name: str, default: str = "") -> str:
            return query.get(name, [default])[-1]

        recursive = arg("recursive").lower() == "true"
        alt = arg("alt", "json" if recursive else "text")
        wait = arg("wait_for_change").lower() == "true"
        if path.rstrip("/") in ("oslogin/users", "oslogin/authorize"):
            self._oslogin(api, record, path.rstrip("/").rsplit("/", 1)[-1], arg)
            return
        if path.startswith("instance/guest-attributes"):
            self._reply(404, "guest attributes are read one key at a time: instance/guest-attributes/NS/KEY")
            return
        try:
            timeout = min(float(arg("timeout_sec") or MAX_WAIT_S), MAX_WAIT_S)
        except ValueError:
            self._reply(400, "timeout_sec must be a number of seconds.")
            return

        def current() -> tuple[bool, str, str]:
            found, node = _lookup(metadata_tree(api, record), path)
            if not found:
                return False, "", ""
            text, kind = render(node, path, recursive, alt)
            return True, text, kind

        found, text, kind = current()
        if not found:
            self._reply(404, f"/computeMetadata/v1/{path} was not found.")
            return
        if wait:
            seen = arg("last_etag") or etag(text)
            deadline = time.monotonic() + timeout
            # A different last_etag answers at once; an equal one waits for a change or the timeout.
            while etag(text) == seen and time.monotonic() < deadline:
                time.sleep(min(WAIT_STEP_S, max(0.0, deadline - time.monotonic())))
                if self.server.stopping.is_set() or api.instance_at(self.client_address[0]) is not record:
                    self._reply(503, "The metadata server or the instance stopped while waiting.")
                    return
                found, text, kind = current()
                if not found:
                    self._reply(404, f"/computeMetadata/v1/{path} was not found.")
                    return
        self._reply(200, text, kind, etag(text))

    def _oslogin(self, api: GuestAttributeMethods, record: InstanceRecord, what: str,
                 arg: Any) -> None:
        """OS Login lookups a guest makes (its NSS module, `google_authorized_keys`): profiles of
        the instance's project by `username` or `uid` (or all, by page), and `authorize` checks."""
        found = oslogin.profiles(api.store, record.project)
        if what == "authorize":
            names = {p["name"] for p in found}
            names |= {a["name"].split("/")[1] for p in found for a in p["posixAccounts"]}
            ok = arg("email") in names  # the account's email or its unique id; no IAM: any profile may
            self._reply(200 if ok else 404, json.dumps({"success": ok}), "application/json")
            return
        username, uid = arg("username"), arg("uid")
        if username or uid:
            found = [p for p in found if any(a["username"] == username or a["uid"] == uid
                                             for a in p["posixAccounts"])]
            if not found:
                self._reply(404, "Not found.")
                return
        self._reply(200, json.dumps({"loginProfiles": found}), "application/json")

    def _guest_attribute(self, api: GuestAttributeMethods, record: InstanceRecord, method: str,
                         path: str, body: bytes) -> None:
        parts = path[len(PREFIX):].split("/")
        if len(parts) != 2 or not all(parts):
            self._reply(404, f"{path} is not emulated (only instance/guest-attributes/NAMESPACE/KEY).")
            return
        namespace, key = parts
        try:
            if method == "PUT":
                if len(body) > MAX_VALUE_BYTES:
                    self._reply(400, f"The value is {len(body)} bytes; at most {MAX_VALUE_BYTES}.")
                    return
                api.put_guest_attribute(record, namespace, key, body.decode("utf-8", errors="replace"))
                self._reply(200, "")
            elif method == "DELETE":
                api.delete_guest_attribute(record, namespace, key)
                self._reply(200, "")
            else:
                value = api.guest_attribute(record, namespace, key)
                self._reply(404 if value is None else 200, "" if value is None else value)
        except GuestAttributeError as exc:
            self._reply(exc.status, exc.message)
        except Exception as exc:  # the server must answer, not drop the connection
            with contextlib.suppress(OSError):
                self._reply(500, f"internal error: {type(exc).__name__}")
