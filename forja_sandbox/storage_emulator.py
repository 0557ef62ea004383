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
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any

from forja_sandbox.iap import _pump

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


class StorageEmulator:
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
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
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
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL, no goodbye: what a crash looks like (fault tests). start() brings it back."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()

    def __enter__(self) -> StorageEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _RelayHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: BridgeRelay = self.server  # type: ignore[assignment]
        try:
            upstream = socket.create_connection(server.target, timeout=10)
        except OSError:
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
        back.start()
        _pump(self.request, upstream)
        back.join()
        upstream.close()


class BridgeRelay(socketserver.ThreadingTCPServer):
    """A TCP relay from one address (the hosts' bridge) to the emulator on 127.0.0.1.

    Why: the sandbox's VMs must reach the store at the bridge address, which exists only once a
    host has booted, while the controller reaches it on 127.0.0.1 from the start; the emulator binds
    one address. Relaying keeps it off every other interface (it has no authentication), and its
    data in one process. The emulator builds upload URLs from the Host header, so a VM's resumable
    uploads come back to the bridge address.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, target: tuple[str, int]) -> None:
        self.target = target
        super().__init__((host, port), _RelayHandler)

    def start(self) -> BridgeRelay:
        threading.Thread(target=self.serve_forever, name="storage-bridge-relay", daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


# --- The shim: four gaps of gcp-storage-emulator that forja relies on, filled in its own process. ---
# It stays small on purpose (README "Cloud Storage" lists it): generation preconditions on writes and
# deletes (the checkpoint promote and marker rely on them), bucket settings sent at creation (the
# emulator keeps only the name), buckets that belong to a project (the emulator lists every bucket
# for every project, so "a bucket of another project" could not be told), and crash-safe writes of
# its files (a SIGKILL mid-write must not leave a torn metadata file that stops the next start).
# The emulator serves one request at a time, so a check followed by the write it guards cannot
# interleave with another write.

_PRECONDITION_FAILED = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [{"domain": "global", "reason": "conditionNotMet", "message": "Precondition Failed"}],
    }
}


def project_number(project: str) -> str:
    """A stable stand-in for a project's number (GCS puts the number, not the ID, on a bucket)."""
    return str(100_000_000_000 + zlib.crc32(project.encode()) % 900_000_000_000)


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


def _precondition_holds(request: Any, storage: Any, bucket: str, name: str | None) -> bool:
    """GCS's ifGenerationMatch / ifGenerationNotMatch on the object `name` (0 = must not exist)."""
    if name is None:
        return True
    current = (storage.objects.get(bucket) or {}).get(name)
    generation = int(current["generation"]) if current else 0
    match = request.query.get("ifGenerationMatch")
    if match and int(match[0]) != generation:
        return False
    not_match = request.query.get("ifGenerationNotMatch")
    return not (not_match and int(not_match[0]) == generation)


def _guarded(handler: Callable[..., Any], target: Callable[[Any, Any], str | None]) -> Callable[..., Any]:
    def guarded(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        bucket = request.params.get("dest_bucket_name") or request.params["bucket_name"]
        if not _precondition_holds(request, storage, bucket, target(request, storage)):
            response.status = HTTPStatus.PRECONDITION_FAILED
            response.json(_PRECONDITION_FAILED)
            return None
        return handler(request, response, storage, *args, **kwargs)

    return guarded


def _install_shim() -> None:
    """Patch gcp-storage-emulator's handlers; must run before its server module builds its routes."""
    from gcp_storage_emulator import storage as gse_storage
    from gcp_storage_emulator.handlers import buckets, objects

    def by_param(key: str) -> Callable[[Any, Any], str | None]:
        return lambda request, _storage: request.params.get(key)

    objects.insert = _guarded(objects.insert, _upload_target)
    objects.upload_partial = _guarded(objects.upload_partial, _upload_target)
    objects.compose = _guarded(objects.compose, by_param("object_id"))
    objects.copy = _guarded(objects.copy, by_param("dest_object_id"))
    objects.rewrite = _guarded(objects.rewrite, by_param("dest_object_id"))
    objects.delete = _guarded(objects.delete, by_param("object_id"))

    original_insert = buckets.insert

    def insert_bucket(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_insert(request, response, storage, *args, **kwargs)
        name = request.data.get("name") if isinstance(request.data, dict) else None
        bucket = storage.buckets.get(name) if name else None
        if bucket is not None and getattr(response, "status", HTTPStatus.OK) == HTTPStatus.OK:
            if request.query.get("project"):
                bucket["projectNumber"] = project_number(request.query["project"][0])
            settings = {k: v for k, v in request.data.items() if k in buckets._WRITABLE_BUCKET_FIELDS}
            if "location" in settings:
                settings["location"] = str(settings["location"]).upper()
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
        items = [b for b in storage.buckets.values()
                 if (wanted is None or b.get("projectNumber") == wanted) and b["name"].startswith(prefix)]
        response.json({"kind": "storage#buckets", "items": items})

    buckets.ls = list_buckets

    def write_bytes_atomically(self: Any, rel: str, content: bytes) -> None:
        if self._use_memory:
            return original_write(self, rel, content)
        path = self._disk_path(self._norm(rel))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return None

    original_write = gse_storage._FileStore.write_bytes
    gse_storage._FileStore.write_bytes = write_bytes_atomically


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
