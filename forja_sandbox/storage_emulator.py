"""The sandbox's Cloud Storage: an existing GCS emulator from the package index, run as a subprocess.

Why a subprocess: a fault test must be able to kill the store mid-upload (SIGKILL) and start it
again on the same port with the same data, exactly as a real outage looks to a client. Clients
reach it only through google-cloud-storage's documented emulator setting, STORAGE_EMULATOR_HOST
(anonymous credentials, project `forja-sandbox`); `url` is that value. Which emulator, and where it
differs from real GCS, is in forja_sandbox/README.md ("Cloud Storage").
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import socketserver
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlsplit

from forja_sandbox.files import write_atomically
from forja_sandbox.http_limits import (
    MAX_BODY,
    MAX_UPLOAD,
    READ_TIMEOUT_S,
    BeyondLimits,
    BodyRefused,
    BoundedRequests,
    check_shape,
)
from forja_sandbox.serving import ServedOnThread, Service, end_process, relay

#: How long start() waits for the emulator to answer HTTP before it gives up.
START_TIMEOUT_S = 20.0
#: How long stop() waits after SIGTERM before it kills.
STOP_TIMEOUT_S = 5.0
#: The child reads its parent's pid here, to die with it (_die_with_parent).
PARENT_ENV = "FORJA_STORAGE_EMULATOR_PARENT"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the kernel's pick), for `port=0`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class StorageEmulator(Service):
    """One emulated Cloud Storage endpoint, started and stopped as a child process.

    `data_dir` given: objects and buckets live there and survive stop/kill/start. `data_dir` None:
    they live in the child's memory and vanish with it.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, data_dir: Path | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The value for STORAGE_EMULATOR_HOST (scheme, host, port; no path)."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        """The emulator's command line: gcp-storage-emulator's own CLI, through main() below."""
        cmd = [sys.executable, "-m", "forja_sandbox.storage_emulator"]
        if self.data_dir is not None:
            cmd += ["--data-dir", str(self.data_dir)]
        cmd += ["start", "--host", self.host, "--port", str(self.port), "--quiet"]
        if self.data_dir is None:
            cmd.append("--in-memory")
        return cmd

    def answers(self) -> bool:
        """Whether the endpoint answers the JSON API (a bucket list) right now."""
        try:
            with urllib.request.urlopen(f"{self.url}/storage/v1/b?project=forja-sandbox", timeout=2) as resp:
                return resp.status == 200
        except urllib.error.HTTPError as exc:
            return exc.code < 500
        except OSError:
            return False

    def start(self) -> StorageEmulator:
        """Start the child (if it is not running) and return once it answers HTTP."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        log = subprocess.DEVNULL
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = self.data_dir / "emulator.log"
            log = self.log_path.open("ab")  # type: ignore[assignment]
        try:
            self._proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env={**os.environ, PARENT_ENV: str(os.getpid())},
            )
        finally:
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                rc = self._proc.returncode
                self._proc = None
                raise RuntimeError(
                    f"the storage emulator exited with {rc} on {self.url}"
                    + (f"; see {self.log_path}" if self.log_path else "")
                )
            if self.answers():
                return self
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"the storage emulator did not answer on {self.url} within {START_TIMEOUT_S} s")

    def stop(self) -> None:
        """Graceful stop: SIGTERM, then SIGKILL after STOP_TIMEOUT_S."""
        proc, self._proc = self._proc, None
        if proc is not None:
            end_process(proc, STOP_TIMEOUT_S)

    def kill(self) -> None:
        """SIGKILL, no goodbye: what a crash looks like (fault tests). start() brings it back."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


class _RelayHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: BridgeRelay = self.server  # type: ignore[assignment]
        try:
            upstream = socket.create_connection(server.target, timeout=10)
        except OSError:
            return
        upstream.settimeout(None)
        relay(self.request, upstream)
        upstream.close()


class BridgeRelay(ServedOnThread, socketserver.ThreadingTCPServer):
    """A TCP relay from one address (the hosts' bridge) to the emulator on 127.0.0.1.

    Why: the sandbox's VMs must reach the store at the bridge address, which exists only once a
    host has booted, while the controller reaches it on 127.0.0.1 from the start; the emulator binds
    one address. Relaying keeps it off every other interface (it has no authentication), and its
    data in one process. The emulator builds upload URLs from the Host header, so a VM's resumable
    uploads come back to the bridge address.
    """

    daemon_threads = True
    allow_reuse_address = True
    thread_name = "storage-bridge-relay"

    def __init__(self, host: str, port: int, target: tuple[str, int]) -> None:
        self.target = target
        super().__init__((host, port), _RelayHandler)


# --- The shim: five gaps of gcp-storage-emulator that forja relies on, filled in its own process. ---
# It stays as small as it can (README "Cloud Storage" lists it): generation preconditions on writes,
# patches and deletes (the checkpoint promote and marker rely on them), bucket settings sent at
# creation (the emulator keeps only the name), buckets that belong to a project (the emulator lists
# every bucket for every project, so "a bucket of another project" could not be told), crash-safe
# writes of its files (a SIGKILL mid-write must not leave a torn metadata file that stops the next
# start), and requests on the wire (bounded reads, checked URLs, names and bodies, Google's error
# body instead of a dropped connection: a fuzz of malformed requests hung it, dropped connections,
# and a bucket named 5 broke every later bucket list). The emulator serves one request at a time,
# so a check followed by the write it guards cannot interleave with another write.

_PRECONDITION_FAILED = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [{"domain": "global", "reason": "conditionNotMet", "message": "Precondition Failed"}],
    }
}
INVALID_ARGUMENT = "Invalid argument."
_INT64 = (-(2**63), 2**63 - 1)
#: Query parameters that GCS types as integers (generations int64, maxResults uint32), and their range.
_INTEGER_PARAMS = {
    **dict.fromkeys(
        ("generation", "sourceGeneration", "ifGenerationMatch", "ifGenerationNotMatch",
         "ifMetagenerationMatch", "ifMetagenerationNotMatch", "ifSourceGenerationMatch",
         "ifSourceGenerationNotMatch", "ifSourceMetagenerationMatch", "ifSourceMetagenerationNotMatch"),
        _INT64),
    "maxResults": (0, 2**32 - 1),
}  # fmt: skip
#: The JSON type of each field of a bucket or object resource that a request may set (GCS: 400 for another).
_BUCKET_FIELDS: dict[str, type] = {
    "name": str, "location": str, "storageClass": str, "labels": dict, "acl": list, "defaultObjectAcl": list,
    "cors": list, "lifecycle": dict, "versioning": dict, "website": dict, "billing": dict,
    "iamConfiguration": dict, "encryption": dict, "logging": dict, "retentionPolicy": dict,
    "softDeletePolicy": dict,
}  # fmt: skip
_OBJECT_FIELDS: dict[str, type] = {
    "name": str, "bucket": str, "contentType": str, "cacheControl": str, "contentDisposition": str,
    "contentEncoding": str, "contentLanguage": str, "crc32c": str, "md5Hash": str, "customTime": str,
    "storageClass": str, "metadata": dict, "acl": list,
}  # fmt: skip
_STRING_MAPS = ("labels", "metadata")
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


class Refused(BodyRefused):
    """A request the shim answers itself, in Google's error body: its status, words and reason."""

    def __init__(self, status: int, message: str, reason: str = "invalid") -> None:
        super().__init__(status, message)
        self.reason = reason


def google_error(status: int, message: str, reason: str) -> dict[str, Any]:
    """Google's error body: what its clients read (code, message, errors[].reason)."""
    return {"error": {"code": status, "message": message,
                      "errors": [{"domain": "global", "reason": reason, "message": message}]}}  # fmt: skip


def project_number(project: str) -> str:
    """A stable stand-in for a project's number (GCS puts the number, not the ID, on a bucket)."""
    return str(100_000_000_000 + zlib.crc32(project.encode()) % 900_000_000_000)


def _integer(key: str, text: str) -> int:
    """A query parameter GCS takes as an integer; 400 "Invalid argument." as GCS says when it is not one."""
    low, high = _INTEGER_PARAMS[key]
    digits = text.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()) or not low <= int(text) <= high:
        raise Refused(400, INVALID_ARGUMENT)
    return int(text)


def _check_url(target: str) -> None:
    """A request's path and query as GCS reads them: UTF-8 once decoded, integers where it takes integers.
    (The emulator decodes with replacement characters and ignores what it does not use.)"""
    url = urlsplit(target)
    try:
        unquote(url.path, errors="strict")
        query = parse_qsl(url.query, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise Refused(400, "The request's URL is not valid UTF-8 once decoded.") from None
    for key, value in query:
        if key in _INTEGER_PARAMS:
            _integer(key, value)


def _check_object_name(name: Any) -> None:
    """GCS's rules for an object's name: 1 to 1024 bytes of UTF-8, no carriage return or line feed, not
    "." or "..", not under .well-known/acme-challenge/."""
    try:
        size = len(name.encode("utf-8")) if isinstance(name, str) else 0
    except UnicodeEncodeError:  # a lone surrogate, from JSON's \ud800
        size = 0
    valid = 1 <= size <= 1024 and "\r" not in name and "\n" not in name and name not in (".", "..")
    if not valid or name.startswith(".well-known/acme-challenge/"):
        raise Refused(400, f"Invalid object name: {str(name)[:80]!r}.")


def _check_bucket_name(name: str) -> None:
    """GCS's rules for a bucket's name: 3 to 63 characters (222 in dot-separated parts of at most 63),
    lowercase letters, digits, "-", "_" and ".", a letter or digit at each end, not an IP address, no
    "goog" prefix, no "google"."""
    parts = name.split(".")
    valid = (
        bool(_BUCKET_NAME.fullmatch(name))
        and len(name) <= (222 if len(parts) > 1 else 63)
        and all(1 <= len(part) <= 63 for part in parts)
        and not re.fullmatch(r"\d+(\.\d+){3}", name)
        and not name.startswith("goog")
        and "google" not in name
    )
    if not valid:
        raise Refused(400, f"Invalid bucket name: {name[:80]!r}")


def _resource(data: Any, fields: dict[str, type]) -> dict[str, Any]:
    """A request body that is a bucket or object resource: a JSON object whose fields have their JSON
    type (null: not set), labels and custom metadata mapping to strings, ACLs and CORS lists of objects.
    Checked before the emulator sets any of it: it stores what it is given, and stops half-way through
    a value it cannot use, leaving the resource half-changed."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Refused(400, "Invalid JSON payload: the request body must be a JSON object.")
    for key, kind in fields.items():
        value = data.get(key)
        if value is not None and not (isinstance(value, kind) and _members_fit(key, value)):
            raise Refused(400, f"Invalid value for {key}: {json.dumps(value)[:80]}")
    return data


def _members_fit(key: str, value: Any) -> bool:
    if key in _STRING_MAPS:
        return all(v is None or isinstance(v, str) for v in value.values())
    return not isinstance(value, list) or all(isinstance(v, dict) for v in value)


def _upload_target(request: Any, storage: Any) -> str | None:
    """The object name an upload request writes (media, multipart, resumable start or chunk)."""
    if "upload_id" in request.query:
        obj = storage.resumable.get(request.query["upload_id"][0]) or {}
        return obj.get("name")
    if "name" in request.query:
        return str(request.query["name"][0])
    data = request.data if isinstance(request.data, dict) else {}
    meta = data.get("meta") if isinstance(data.get("meta"), dict) else data
    return meta.get("name") if isinstance(meta, dict) else None


def _check_upload(request: Any) -> None:
    """An upload's type, resource and name (a chunk of a started session has its own check)."""
    if "upload_id" in request.query:
        return
    upload_type = (request.query.get("uploadType") or [""])[0]
    if upload_type == "multipart":
        if not (isinstance(request.data, dict) and "meta" in request.data):
            raise Refused(400, "A multipart upload is the object's JSON resource, then its bytes.")
        _resource(request.data["meta"], _OBJECT_FIELDS)
    elif upload_type == "resumable":
        _resource(request.data, _OBJECT_FIELDS)
    elif upload_type != "media":
        raise Refused(400, f"Invalid upload type {upload_type[:40]!r}: media, multipart or resumable.")
    if _upload_target(request, None) is None:
        raise Refused(400, "Required parameter: name.", "required")


def _check_chunk(request: Any) -> None:
    """A resumable chunk's Content-Range against the bytes it came with. GCS refuses a range it cannot
    parse or that does not fit them; the emulator took such a chunk for the whole object, or its first
    bytes for the rest. No Content-Range: the whole object in one request, as GCS allows."""
    from gcp_storage_emulator.handlers import objects

    header = request.get_header("Content-Range")
    if header is None:
        return
    parsed = objects._parse_resumable_content_range(header)
    if parsed is None:
        raise Refused(400, "Failed to parse Content-Range header.")
    if parsed["kind"] == "status":
        return
    size = len(request.data or b"")
    start, end, total = parsed["start"], parsed["end"], parsed["total"]
    end = start + size - 1 if end is None else end  # bytes START-*/TOTAL: the body is the rest
    if end - start + 1 != size or (total is not None and end >= total):
        raise Refused(400, f"Content-Range {header[:80]!r} does not fit the {size} bytes sent.")


def precondition_holds(request: Any, storage: Any, bucket: str, name: str | None) -> bool:
    """GCS's ifGenerationMatch / ifGenerationNotMatch on the object `name` (0 = must not exist); a
    value that is not an integer is a 400 (:class:`Refused`), as on GCS."""
    if name is None:
        return True
    current = (storage.objects.get(bucket) or {}).get(name)
    generation = int(current["generation"]) if current else 0
    match = request.query.get("ifGenerationMatch")
    if match and _integer("ifGenerationMatch", match[0]) != generation:
        return False
    not_match = request.query.get("ifGenerationNotMatch")
    return not (not_match and _integer("ifGenerationNotMatch", not_match[0]) == generation)


def _guarded(handler: Callable[..., Any], target: Callable[[Any, Any], str | None]) -> Callable[..., Any]:
    def guarded(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        bucket = request.params.get("dest_bucket_name") or request.params["bucket_name"]
        name = target(request, storage)
        if name is not None:
            _check_object_name(name)
        if not precondition_holds(request, storage, bucket, name):
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json(_PRECONDITION_FAILED)
            return None
        return handler(request, response, storage, *args, **kwargs)

    return guarded


def _checked(handler: Callable[..., Any], check: Callable[[Any], Any]) -> Callable[..., Any]:
    """``handler`` once ``check`` (which raises :class:`Refused`) has passed the request: GCS validates a
    request before it looks at its preconditions or the store."""

    def checked(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        check(request)
        return handler(request, response, storage, *args, **kwargs)

    return checked


def _inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """A gzip or deflate body, decoded as the emulator's own reader does, to at most ``limit`` bytes (a
    small body must not expand into gigabytes)."""
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error:
        raise Refused(400, f"The body is not valid {encoding} data.", "parseError") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise Refused(413, f"Request payload size exceeds the limit: {limit} bytes.", "badRequest")
    if not inflater.eof:
        raise Refused(400, f"The body ends before its {encoding} stream does.", "parseError")
    return out


@dataclass(frozen=True)
class _Body:
    data: bytes
    raw: bool  # an object's bytes, handed to the emulator as they came (else JSON, multipart or batch)


def _read_request_body(handler: Any, method: str) -> _Body:
    """The body, read before any handler runs: within MAX_UPLOAD where it carries an object's bytes
    (an upload to the route that stores them), within MAX_BODY where it is metadata."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    url = urlsplit(handler.path)
    query = parse_qs(url.query)
    route = next((table for regex, table in server.HANDLERS if re.fullmatch(regex, url.path)), {})
    serves = route.get(method)
    if serves is None and method == "POST" and query.get("uploadType") and url.path.endswith("/o"):
        serves = objects.insert  # the emulator's own fallback: an upload without the /upload prefix
    upload_type = (query.get("uploadType") or [""])[0]
    raw = serves in (objects.upload_partial, objects.xml_upload) or (
        serves is objects.insert and ("upload_id" in query or upload_type == "media"))  # fmt: skip
    upload = raw or (serves is objects.insert and upload_type == "multipart")
    limit = MAX_UPLOAD if upload else MAX_BODY
    data = handler.read_body(limit)
    encoding = handler.headers.get("Content-Encoding")
    if data and encoding in ("gzip", "deflate"):
        data = _inflate(data, encoding, limit)
    return _Body(data, raw)


def _answer(handler: Any, status: int, message: str, reason: str) -> None:
    from gcp_storage_emulator import server

    response = server.Response(handler)
    response.status = HTTPStatus(status)
    response.json(google_error(status, message, reason))
    response.close()


def _install_front(server: Any) -> None:
    """The emulator's HTTP front, patched: reads bounded by forja_sandbox/http_limits.py (a begun
    request has READ_TIMEOUT_S, and so has a connection before its request: the emulator serves one
    at a time); the URL and body checked before any handler; the body read once, a resumable chunk's
    or media upload's bytes passed on as bytes whatever their Content-Type, JSON within the limits;
    and an exception a handler raises on what it was sent answered 400 in Google's words (with its
    traceback in the emulator's log) where the emulator dropped the connection."""

    class Handler(BoundedRequests, server.RequestHandler):
        idle_timeout_s = READ_TIMEOUT_S

    class Router(server.Router):
        def handle(self, method: str) -> None:
            handler = self._request_handler
            try:
                _check_url(handler.path)
                handler.forja_body = _read_request_body(
                    handler, handler.headers.get("x-http-method-override") or method
                )
                super().handle(method)
            except (ConnectionError, TimeoutError):
                raise  # the client left or stopped reading: nobody to answer
            except BodyRefused as refused:
                _answer(handler, refused.status, refused.message, getattr(refused, "reason", "badRequest"))
            except Exception:
                traceback.print_exc()
                _answer(handler, 400, INVALID_ARGUMENT, "invalid")

    read_data = server._read_data

    def read_checked_data(handler: Any, query: dict[str, list[str]]) -> Any:
        body: _Body = handler.forja_body
        if body.raw:
            return body.data or None
        try:
            data = read_data(handler, query)
            if isinstance(data, dict | list):
                check_shape(data)
        except BeyondLimits as exc:
            raise Refused(400, f"Parse Error: {exc}.", "parseError") from None
        except Exception:  # not JSON, not multipart: whatever the emulator's parsing raised
            raise Refused(400, "Parse Error", "parseError") from None
        return data

    server.RequestHandler = Handler  # the server is built from these names when it starts
    server.Router = Router
    server._read_raw_data = lambda handler: handler.forja_body.data
    server._decode_raw_data = lambda raw, _handler: raw or None  # decoded (and bounded) on reading
    server._read_data = read_checked_data


def _install_shim() -> None:
    """Patch gcp-storage-emulator's handlers; must run before its server module builds its routes."""
    from gcp_storage_emulator import storage as gse_storage
    from gcp_storage_emulator.handlers import buckets, objects

    def by_param(key: str) -> Callable[[Any, Any], str | None]:
        return lambda request, _storage: request.params.get(key)

    def object_body(request: Any) -> None:
        _resource(request.data, _OBJECT_FIELDS)

    def bucket_body(request: Any) -> None:
        _resource(request.data, _BUCKET_FIELDS)

    objects.insert = _checked(_guarded(objects.insert, _upload_target), _check_upload)
    objects.upload_partial = _checked(_guarded(objects.upload_partial, _upload_target), _check_chunk)
    objects.compose = _guarded(objects.compose, by_param("object_id"))
    objects.copy = _guarded(objects.copy, by_param("dest_object_id"))
    objects.rewrite = _guarded(objects.rewrite, by_param("dest_object_id"))
    objects.delete = _guarded(objects.delete, by_param("object_id"))
    objects.patch = _checked(_guarded(objects.patch, by_param("object_id")), object_body)
    objects.xml_upload = _checked(objects.xml_upload, lambda r: _check_object_name(r.params["object_id"]))
    buckets.patch = _checked(buckets.patch, bucket_body)

    original_insert = buckets.insert

    def insert_bucket(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        data = _resource(request.data, _BUCKET_FIELDS)
        name = data.get("name")
        if not name:
            raise Refused(400, "Required: the bucket's name.", "required")
        _check_bucket_name(name)
        result = original_insert(request, response, storage, *args, **kwargs)
        bucket = storage.buckets.get(name)
        if bucket is not None and getattr(response, "status", HTTPStatus.OK) == HTTPStatus.OK:
            if request.query.get("project"):
                bucket["projectNumber"] = project_number(request.query["project"][0])
            writable = buckets._WRITABLE_BUCKET_FIELDS
            settings = {k: v for k, v in data.items() if k in writable and v is not None}
            if "location" in settings:
                settings["location"] = settings["location"].upper()
                bucket["locationType"] = "region" if "-" in settings["location"] else "multi-region"
            buckets._patch_bucket(bucket, settings)
            bucket["metageneration"] = "1"
            storage.create_bucket(name, bucket)
            response.json(bucket)
        return result

    buckets.insert = insert_bucket

    def list_buckets(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        """buckets.list names one project's buckets (the emulator lists all), and honours prefix."""
        wanted = project_number(request.query["project"][0]) if request.query.get("project") else None
        prefix = request.query["prefix"][0] if request.query.get("prefix") else ""
        items = [
            b
            for b in storage.buckets.values()
            if (wanted is None or b.get("projectNumber") == wanted) and b["name"].startswith(prefix)
        ]
        response.json({"kind": "storage#buckets", "items": items})

    buckets.ls = list_buckets

    def write_bytes_atomically(self: Any, rel: str, content: bytes) -> None:
        if self._use_memory:
            return original_write(self, rel, content)
        write_atomically(self._disk_path(self._norm(rel)), content, fsync=True)
        return None

    original_write = gse_storage._FileStore.write_bytes
    gse_storage._FileStore.write_bytes = write_bytes_atomically

    from gcp_storage_emulator import server  # builds its routes from the handlers patched above

    _install_front(server)


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when the one that started it dies (a test or the sandbox
    service killed outright must not leave an emulator holding its port and data)."""
    parent = int(os.environ.get(PARENT_ENV) or 0)
    if not parent:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    """`python -m forja_sandbox.storage_emulator ARGS`: gcp-storage-emulator's own CLI, shim installed."""
    _die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _install_shim()
    from gcp_storage_emulator.__main__ import main as emulator_main

    emulator_main(sys.argv[1:] if argv is None else argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
