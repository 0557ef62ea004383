# Copyright: forja contributors
# Apache-2.0
"""Datasets in a bucket: the push from the controller and the staging onto a host, in one home.

Layout (README "Datasets"; the trainer's shard reader and the host staging read it):

    gs://BUCKET/datasets/blobs/<sha256 hex>      one object per distinct file content
    gs://BUCKET/datasets/<NAME>/manifest.json    written LAST: its presence means "complete"

Why content-addressed: a second push of a changed dataset sends only the files whose content is
new, two datasets sharing files store them once, and a push that was interrupted resumes by
skipping the blobs already there (same name, same size, same CRC32C). Large files go up as
resumable uploads in chunks, so a dropped connection resends a chunk, not the file. Every blob's
CRC32C is given to Cloud Storage with the upload (which refuses a body that does not match) and
checked again against what the service reports; the manifest carries SHA-256 and CRC32C of each
file so a reader can verify what it reads.

Who uses it: the module forja.gpu.forja_dataset_push (ansible-playbook users, role forja.gpu.dataset)
and forja's Python (`forja data push`, `Forja.push_data`, loaded by path in forja/datasets.py) call
`push`; the module forja.gpu.forja_dataset_stage calls `stage` on the host. `stage` needs only the
standard library and Ansible's own ``open_url`` (a host's system Python has no google-cloud-storage):
it speaks Cloud Storage's JSON API with a token from the VM's metadata server (the VM's own service
account), or without one at an emulator (STORAGE_EMULATOR_HOST).
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from ansible.module_utils.urls import open_url

try:  # Ansible ships the sibling with the module (AnsiballZ)
    from ansible_collections.forja.gpu.plugins.module_utils.forja_files import Walk, walk
except ImportError:  # forja's Python loads this file by path (forja/datasets.py), and the sibling first
    from forja_files import Walk, walk  # type: ignore[no-redef]

try:
    import google_crc32c
    from google.api_core import exceptions as api_exceptions
    from google.cloud.storage.retry import DEFAULT_RETRY

    HAS_STORAGE = True
    STORAGE_IMPORT_ERROR = None
except ImportError as exc:  # the host side (stage) needs none of it
    HAS_STORAGE = False
    STORAGE_IMPORT_ERROR = exc

MANIFEST_VERSION = 1
BLOB_PREFIX = "datasets/blobs/"
#: What a dataset may be called: a folder name on the host and an object prefix in the bucket.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
BUCKET_URL_RE = re.compile(r"^gs://([a-z0-9][a-z0-9._-]{1,220}[a-z0-9])/?$")
#: Files from this size up go as resumable uploads in chunks (a multiple of 256 KiB, as GCS requires):
#: a dropped connection resends one chunk. Each upload thread holds one chunk in memory (8 x 32 MiB).
RESUMABLE_FROM = 8 * 1024 * 1024
CHUNK_SIZE = 32 * 1024 * 1024
#: How long one request may go unanswered before it is retried, and how long one blob is retried
#: before the push gives up: per request, never for the whole push (long pushes must not fail on a clock).
REQUEST_TIMEOUT_S = 60.0
RETRY_DEADLINE_S = 300.0
#: On the host: the staged copy of the manifest, written last (its presence = staged and verified).
STAGED_MARKER = ".forja-dataset.json"
#: Where rsync keeps partly sent files between tries (the push straight to a host without a bucket).
PARTIAL_DIR = ".forja-partial"
GOOGLE_ENDPOINT = "https://storage.googleapis.com"
METADATA_TOKEN_URL = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
#: Space the staging leaves free on the host's disk beyond the dataset (logs, checkpoints).
STAGE_RESERVE_BYTES = 256 * 1024 * 1024
_READ = 1024 * 1024


class DatasetError(Exception):
    """Bad input or a refused/failed transfer: `field` names what to change, the message how."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = f"{field_name}: {message}"


class TransferError(DatasetError):
    """The input was fine but the transfer failed (no answer, a checksum mismatch): try again."""


@dataclass(frozen=True)
class FileEntry:
    """One file of a dataset as the manifest lists it (`local`: where it is on the controller)."""

    path: str
    size: int
    sha256: str
    crc32c: str
    local: str = ""

    def manifest(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "crc32c": self.crc32c}


@dataclass(frozen=True)
class Progress:
    """Where a push or a staging is: `phase` is "hash", "upload", "download" or "manifest"."""

    phase: str
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


@dataclass
class PushResult:
    """What a push did. `uploaded_*` counts what was sent this time; `skipped_files` were there."""

    name: str
    url: str
    manifest_url: str
    files: int
    total_size: int
    uploaded_files: int
    uploaded_bytes: int
    skipped_files: int
    #: False when the bucket's manifest already listed exactly these files (nothing changed).
    manifest_written: bool = True
    excluded: list[str] = field(default_factory=list)
    secrets_excluded: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StageResult:
    """What a staging did on the host: files fetched (missing or altered), removed (not in the manifest)."""

    name: str
    dest: str
    files: int
    total_size: int
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    removed: list[str] = field(default_factory=list)
    #: The staged manifest copy was missing or stale and was written (the data itself was verified).
    marker_written: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.downloaded or self.removed or self.marker_written)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "changed": self.changed}


ProgressFn = Callable[[Progress], None]


# --- names ------------------------------------------------------------------------------------
def manifest_object(name: str) -> str:
    return f"datasets/{name}/manifest.json"


def blob_object(sha256: str) -> str:
    return f"{BLOB_PREFIX}{sha256}"


def check_name(name: str, field_name: str = "name") -> str:
    if not NAME_RE.match(name or ""):
        raise DatasetError(field_name, f"{name!r} is not a dataset name; use 1-63 letters, digits, '.', '_' "
                                       "or '-', starting with a letter or digit (e.g. digits-v2)")
    return name


def bucket_from_url(url: str, field_name: str = "bucket") -> str:
    """The bucket of ``gs://BUCKET`` (a dataset lives at gs://BUCKET/datasets/NAME)."""
    found = BUCKET_URL_RE.match(url or "")
    if not found:
        raise DatasetError(field_name, f"{url!r} is not a bucket URL; give gs://BUCKET (e.g. gs://my-project-data)")
    return found.group(1)


def check_source(path: str, field_name: str = "path") -> str:
    """The dataset folder, resolved; a missing, non-folder or unreadable one is refused here."""
    full = os.path.realpath(os.path.expanduser(path))
    if not os.path.exists(full):
        raise DatasetError(field_name, f"{path} does not exist; give the folder that holds the dataset")
    if not os.path.isdir(full):
        raise DatasetError(field_name, f"{path} is a file, not a folder; give the folder that holds it")
    if not os.access(full, os.R_OK | os.X_OK):
        raise DatasetError(field_name, f"{path} cannot be read by this user; fix its permissions "
                                       "(chmod u+rx)")
    return full


# --- hashing ------------------------------------------------------------------------------------
def hash_file(path: str) -> tuple[str, str]:
    """SHA-256 (hex) and CRC32C (base64, as Cloud Storage reports it) of one file, in one read."""
    sha = hashlib.sha256()
    crc = google_crc32c.Checksum()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_READ), b""):
            sha.update(chunk)
            crc.update(chunk)
    return sha.hexdigest(), base64.b64encode(crc.digest()).decode("ascii")


def scan(root: str, excludes: list[str], detect_secrets: bool, threads: int,
         on_progress: ProgressFn | None = None) -> tuple[list[FileEntry], Walk]:
    """The dataset's files with their hashes, leaving out what the bundle leaves out (forja_files)."""
    found = walk(root, excludes, detect_secrets)
    if found.unreadable:
        raise DatasetError("path", f"cannot list {', '.join(found.unreadable[:5])} under {root}; fix the "
                                   "permissions or exclude it")
    if not found.files:
        raise DatasetError("path", f"{root} holds no file to push (after {len(found.excluded)} left out by "
                                   "the excludes and the secret check)")
    total = sum(item.size for item in found.files)
    done = [0, 0]
    lock = threading.Lock()

    def one(item: Any) -> FileEntry:
        try:
            sha, crc = hash_file(item.path)
        except OSError as exc:
            raise DatasetError("path", f"cannot read {item.path} ({exc.strerror}); fix its permissions or "
                                       "exclude it") from None
        with lock:
            done[0] += 1
            done[1] += item.size
            if on_progress:
                on_progress(Progress("hash", done[0], len(found.files), done[1], total))
        return FileEntry(item.rel, item.size, sha, crc, item.path)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        entries = list(pool.map(one, found.files))
    return entries, found


# --- push (controller, google-cloud-storage) ----------------------------------------------------
def make_client(project: str | None, emulator: str | None, credentials_file: str | None = None) -> Any:
    """A google-cloud-storage client for forja's Python: an emulator without credentials, a
    service-account key, or application default credentials (the modules use forja_gcp_storage's)."""
    from google.cloud import storage

    if emulator:
        return storage.Client(project=project or "forja-sandbox", client_options={"api_endpoint": emulator},
                              use_auth_w_custom_endpoint=False)
    if credentials_file:
        return storage.Client.from_service_account_json(os.path.expanduser(credentials_file), project=project)
    return storage.Client(project=project)


def api_message(exc: BaseException) -> str:
    return str(getattr(exc, "message", "") or exc).splitlines()[0][:300]


def _bucket_error(exc: BaseException, bucket: str, endpoint: str) -> DatasetError:
    if isinstance(exc, api_exceptions.Forbidden):
        return DatasetError("bucket", f"these credentials may not use gs://{bucket} "
                                      f"(403: {api_message(exc)}); grant roles/storage.objectAdmin on that "
                                      "bucket to the account forja runs as, or give a bucket of yours")
    if isinstance(exc, api_exceptions.NotFound):
        return DatasetError("bucket", f"gs://{bucket} does not exist; create it (forja up -e "
                                      f"gcp_bucket_name={bucket}) or give another")
    if isinstance(exc, api_exceptions.Unauthorized):
        return DatasetError("bucket", f"Cloud Storage refused the credentials (401: {api_message(exc)}); "
                                      "log in again (gcloud auth application-default login) or set "
                                      "FORJA_GCP_CREDENTIALS_FILE")
    return TransferError(
        "bucket",
        f"gs://{bucket} at {endpoint} did not answer ({type(exc).__name__}: {api_message(exc)}); check "
        "the network (or STORAGE_EMULATOR_HOST) and push again: what was sent is kept and skipped",
    )


def _is_checksum_error(exc: BaseException) -> bool:
    text = api_message(exc).lower()
    return type(exc).__name__.startswith("DataCorruption") or (
        isinstance(exc, api_exceptions.GoogleAPICallError)
        and ("checksum" in text or "crc32c" in text or "md5" in text)
    )


class _Counting:
    """A file object that reports what was read from it (how many bytes went up so far), and stops
    an upload in flight once `stop` is set (another upload failed, or Ctrl-C): the push ends at
    once instead of waiting for every large file in flight to finish."""

    def __init__(self, fh: Any, on_read: Callable[[int], None], stop: threading.Event) -> None:
        self._fh = fh
        self._on_read = on_read
        self._stop = stop

    def read(self, size: int = -1) -> bytes:
        if self._stop.is_set():
            raise _Stopped()
        data = self._fh.read(size)
        self._on_read(len(data))
        return bytes(data)

    def seek(self, *args: Any) -> int:
        return int(self._fh.seek(*args))

    def tell(self) -> int:
        return int(self._fh.tell())


class _Stopped(Exception):
    """Raised inside an upload in flight when the push is stopping."""


def build_manifest(name: str, entries: list[FileEntry]) -> dict[str, Any]:
    """The manifest of interface 1 (README "Datasets"): the same for a bucket and for a host's disk."""
    return {
        "version": MANIFEST_VERSION,
        "name": name,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "total_size": sum(e.size for e in entries),
        "files": [e.manifest() for e in entries],
    }


def plan(root: str, name: str, excludes: list[str], detect_secrets: bool, threads: int,
         out_dir: str) -> dict[str, Any]:
    """For a push straight to a host's disk: hash the folder, write its manifest to `out_dir`.

    Returns what the role needs: the manifest's path, the folder, the counts and what was left out.
    """
    check_name(name)
    root = check_source(root)
    entries, found = scan(root, excludes, detect_secrets, threads)
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.manifest.json")
    manifest = build_manifest(name, entries)
    try:
        with open(path, encoding="utf-8") as fh:
            before = json.load(fh)
        if before.get("files") == manifest["files"]:  # unchanged: the same bytes, so no host sees a change
            manifest["created"] = before.get("created", manifest["created"])
    except (OSError, ValueError):
        pass
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
    return {"manifest_path": path, "src": root, "files": len(entries),
            "total_size": sum(e.size for e in entries), "excluded": found.excluded,
            "secrets_excluded": found.secrets}


def push(
    client: Any,
    bucket: str,
    name: str,
    root: str,
    excludes: list[str],
    detect_secrets: bool = True,
    threads: int = 8,
    on_progress: ProgressFn | None = None,
    request_timeout: float = REQUEST_TIMEOUT_S,
    retry_deadline: float = RETRY_DEADLINE_S,
) -> PushResult:
    """Push folder `root` as dataset `name` to `bucket` with a google-cloud-storage `client`.

    Order: check the inputs, hash, list the blobs the bucket has (this read is the access check:
    a 403 stops the push before anything is written), upload the missing ones in `threads`
    parallel uploads, verify each, then write the manifest. An interruption leaves blobs and no
    new manifest: nothing partial looks complete, and the next push skips what is there.
    """
    if not HAS_STORAGE:
        raise DatasetError("python", f"google-cloud-storage is not installed ({STORAGE_IMPORT_ERROR}); "
                                     "pip install forja")
    started = time.monotonic()
    check_name(name)
    root = check_source(root)
    endpoint = str(getattr(client, "api_endpoint", None) or GOOGLE_ENDPOINT)
    retry = DEFAULT_RETRY.with_deadline(retry_deadline)
    gcs = client.bucket(bucket)
    try:  # the access check, before anything is hashed or written
        previous = gcs.get_blob(manifest_object(name), timeout=request_timeout, retry=retry)
        found_before = previous.download_as_bytes(timeout=request_timeout, retry=retry) if previous else b"{}"
        before = json.loads(found_before)
        blobs = client.list_blobs(gcs, prefix=BLOB_PREFIX, timeout=request_timeout, retry=retry)
        listed = {b.name: b for b in blobs}
    except Exception as exc:  # told apart in _bucket_error
        raise _bucket_error(exc, bucket, endpoint) from None

    entries, found = scan(root, excludes, detect_secrets, threads, on_progress)
    total = sum(e.size for e in entries)
    by_blob: dict[str, FileEntry] = {}
    for entry in entries:
        by_blob.setdefault(entry.sha256, entry)

    def present(entry: FileEntry) -> bool:
        have = listed.get(blob_object(entry.sha256))
        return have is not None and int(have.size or -1) == entry.size and have.crc32c == entry.crc32c

    to_send = [e for e in by_blob.values() if not present(e)]
    send_total = sum(e.size for e in to_send)
    lock = threading.Lock()
    stop = threading.Event()
    state = {"files": 0, "bytes": 0}

    def report(phase: str) -> None:
        if on_progress:
            on_progress(Progress(phase, state["files"], len(to_send), state["bytes"], send_total))

    def read(n: int) -> None:
        with lock:
            state["bytes"] += n
            report("upload")

    def upload(entry: FileEntry) -> None:
        chunked = entry.size >= RESUMABLE_FROM  # resumable, in chunks: a dropped connection resends a chunk
        blob = gcs.blob(blob_object(entry.sha256), chunk_size=CHUNK_SIZE if chunked else None)
        blob.content_type = "application/octet-stream"
        blob.metadata = {"sha256": entry.sha256}
        try:
            with open(entry.local, "rb") as fh:
                blob.upload_from_file(_Counting(fh, read, stop), size=entry.size, checksum="crc32c",
                                      crc32c_checksum_value=entry.crc32c, timeout=request_timeout,
                                      retry=retry)
        except _Stopped:
            return
        except OSError as exc:
            raise DatasetError("path", f"cannot read {entry.local} ({exc.strerror}); push again once it is "
                                       "readable") from None
        except Exception as exc:  # a checksum refusal or a failed request
            if _is_checksum_error(exc):
                raise TransferError("checksum", f"{entry.path}: Cloud Storage received other bytes than "
                                                f"were sent ({api_message(exc)}); nothing was recorded for "
                                                "it, push again") from None
            raise _bucket_error(exc, bucket, endpoint) from None
        if blob.crc32c != entry.crc32c or int(blob.size or -1) != entry.size:
            blob.delete(timeout=request_timeout, retry=retry)
            raise TransferError("checksum", f"{entry.path}: gs://{bucket}/{blob.name} holds {blob.size} "
                                            f"bytes with CRC32C {blob.crc32c}, not the {entry.size} bytes "
                                            f"with {entry.crc32c} sent; it was removed, push again")
        with lock:
            state["files"] += 1
            report("upload")

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        futures = [pool.submit(upload, e) for e in sorted(to_send, key=lambda e: -e.size)]
        try:
            for future in concurrent.futures.as_completed(futures):
                future.result()
        except BaseException:
            stop.set()
            for other in futures:
                other.cancel()
            raise

    manifest = build_manifest(name, entries)
    report("manifest")
    same = before.get("version") == MANIFEST_VERSION and before.get("files") == manifest["files"]
    if not same:  # an unchanged dataset keeps its manifest (and its creation time): nothing to write
        body = json.dumps(manifest, indent=1).encode()
        try:
            gcs.blob(manifest_object(name)).upload_from_string(
                body, content_type="application/json", checksum="crc32c", timeout=request_timeout,
                retry=retry)
        except Exception as exc:
            raise _bucket_error(exc, bucket, endpoint) from None
    return PushResult(
        name=name, url=f"gs://{bucket}/datasets/{name}", manifest_url=f"gs://{bucket}/{manifest_object(name)}",
        files=len(entries), total_size=total, uploaded_files=len(to_send), uploaded_bytes=send_total,
        skipped_files=len(by_blob) - len(to_send), manifest_written=not same, excluded=found.excluded,
        secrets_excluded=found.secrets, seconds=time.monotonic() - started,
    )


# --- stage (host, standard library and open_url) ------------------------------------------------------------
class _Store:
    """Cloud Storage's JSON API over Ansible's open_url (urllib inside): read a manifest, stream a blob."""

    def __init__(self, bucket: str, emulator: str | None, timeout: float, token_url: str) -> None:
        self.bucket = bucket
        self.base = (emulator or GOOGLE_ENDPOINT).rstrip("/")
        self.timeout = timeout
        self.token_url = token_url
        self.anonymous = bool(emulator)
        self._token: tuple[str, float] | None = None
        self._lock = threading.Lock()

    def _headers(self) -> dict[str, str]:
        if self.anonymous:
            return {}
        with self._lock:
            if self._token is None or self._token[1] < time.time() + 60:
                try:
                    headers = {"Metadata-Flavor": "Google"}
                    with open_url(self.token_url, headers=headers, timeout=self.timeout) as resp:
                        data = json.load(resp)
                except (OSError, ValueError) as exc:
                    raise DatasetError("credentials", f"the VM's metadata server gave no token ({exc}); "
                                                      "stage on a GCE VM with a service account, or set "
                                                      "storage_emulator_host") from None
                self._token = (data["access_token"], time.time() + float(data.get("expires_in", 300)))
            return {"Authorization": f"Bearer {self._token[0]}"}

    def open(self, obj: str) -> Any:
        url = f"{self.base}/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(obj, safe='')}?alt=media"
        for attempt in range(6):
            try:
                return open_url(url, headers=self._headers(), timeout=self.timeout)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    raise
                if exc.code == 403:
                    raise DatasetError("bucket", f"the VM's service account may not read gs://{self.bucket} "
                                                 "(403); grant it roles/storage.objectViewer on the bucket "
                                                 "(roles/gcp_bucket does)") from None
                if (exc.code < 500 and exc.code != 429) or attempt == 5:
                    raise TransferError("bucket", f"gs://{self.bucket}/{obj}: HTTP {exc.code}") from None
            except OSError as exc:
                if attempt == 5:
                    raise TransferError(
                        "bucket", f"{self.base} did not answer for gs://{self.bucket}/{obj} ({exc}); check "
                        "the network and stage again",
                    ) from None
            time.sleep(min(2 ** attempt, 30))
        raise AssertionError("unreachable")


def read_manifest(store: _Store, name: str) -> dict[str, Any]:
    try:
        with store.open(manifest_object(name)) as resp:
            manifest = json.load(resp)
    except urllib.error.HTTPError:
        raise DatasetError("name", f"gs://{store.bucket}/{manifest_object(name)} does not exist: no complete "
                                   f"dataset {name!r} there; push it first (forja data push PATH --name "
                                   f"{name})") from None
    return check_manifest(manifest, name, f"gs://{store.bucket}/{manifest_object(name)}")


def check_manifest(manifest: Any, name: str, where: str) -> dict[str, Any]:
    """A version-1 manifest whose paths all stay inside the dataset's folder, or an error naming `where`."""
    if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION or not isinstance(
            manifest.get("files"), list):
        raise DatasetError("name", f"{where} is not a version {MANIFEST_VERSION} manifest; push the dataset "
                                   "again with this forja")
    for item in manifest["files"]:
        rel = str(item.get("path", ""))
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or not rel or parts[0] == PARTIAL_DIR:
            raise DatasetError("name", f"the manifest of {name!r} names an unsafe path {rel!r}; push it "
                                       "again")
    return manifest


def sha256_of(path: str) -> str | None:
    try:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(_READ), b""):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None


def _same_bytes(path: str, body: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read() == body
    except OSError:
        return False


def _free_bytes(path: str) -> tuple[int, str]:
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "/"
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize, probe


def compare(
    dest: str, files: dict[str, dict[str, Any]], threads: int
) -> tuple[list[dict[str, Any]], list[str]]:
    """The manifest's files missing or altered in `dest` (size, then SHA-256), and files it does not list."""

    def current(item: dict[str, Any]) -> bool:
        local = os.path.join(dest, item["path"])
        return (os.path.isfile(local) and not os.path.islink(local) and os.path.getsize(local) == item["size"]
                and sha256_of(local) == item["sha256"])

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        ok = dict(zip(files, pool.map(current, files.values()), strict=True))
    missing = [files[p] for p in files if not ok[p]]
    extra = []
    if os.path.isdir(dest):
        for dirpath, dirs, names in os.walk(dest):
            if dirpath == dest and PARTIAL_DIR in dirs:
                dirs.remove(PARTIAL_DIR)  # rsync's partly sent files: kept for the next try
            for f in names:
                rel = os.path.relpath(os.path.join(dirpath, f), dest).replace(os.sep, "/")
                if rel != STAGED_MARKER and rel not in files:
                    extra.append(rel)
    return missing, sorted(extra)


def check_space(name: str, dest: str, missing: list[dict[str, Any]], reserve_bytes: int) -> int:
    """The bytes the missing files need; more than the disk of `dest` has free is refused here."""
    need = sum(int(item["size"]) for item in missing)
    free, where = _free_bytes(dest)
    if need + reserve_bytes > free:
        raise DatasetError("dest", f"dataset {name!r} needs {need} more bytes on {where} (plus "
                                   f"{reserve_bytes} kept free) but {free} are free; grow the VM's disk "
                                   "(gcp_instance_disk_size_gb) or free space there; nothing was changed")
    return need


def _plan(name: str, manifest: dict[str, Any], dest_root: str,
          threads: int) -> tuple[StageResult, str, list[dict[str, Any]], list[str], bytes]:
    """What staging ``manifest`` at <dest_root>/<name> finds: the result to fill, the marker's path,
    the missing or altered files, the files the manifest does not list, and the marker's bytes."""
    dest = os.path.join(dest_root, name)
    files = {item["path"]: item for item in manifest["files"]}
    result = StageResult(name=name, dest=dest, files=len(files),
                         total_size=int(manifest.get("total_size", 0)))
    missing, extra = compare(dest, files, threads)
    body = json.dumps(manifest, indent=1, sort_keys=True).encode()
    return result, os.path.join(dest, STAGED_MARKER), missing, extra, body


def _unmark(dest: str, marker: str, extra: list[str]) -> None:
    """Before files change: the marker goes first (a cut-short staging never looks complete), then
    the files the manifest does not list."""
    if os.path.exists(marker):
        os.unlink(marker)
    os.makedirs(dest, mode=0o755, exist_ok=True)
    for rel in extra:
        os.unlink(os.path.join(dest, rel))


def _mark(marker: str, body: bytes) -> None:
    """The staged manifest copy, written last and renamed into place."""
    tmp_marker = f"{marker}.tmp"
    with open(tmp_marker, "wb") as fh:
        fh.write(body)
    os.replace(tmp_marker, marker)


def stage(
    bucket: str,
    name: str,
    dest_root: str,
    emulator: str | None = None,
    threads: int = 8,
    check_mode: bool = False,
    timeout: float = REQUEST_TIMEOUT_S,
    token_url: str = METADATA_TOKEN_URL,
    reserve_bytes: int = STAGE_RESERVE_BYTES,
) -> StageResult:
    """Make <dest_root>/<name> hold exactly the pushed dataset, each file's SHA-256 verified.

    Every file on the host is hashed and compared with the manifest; only missing or altered
    files are fetched (to a temporary name, verified, then renamed), files the manifest does not
    list are removed, and the staged manifest copy (STAGED_MARKER) is removed first and written
    last, so a staging cut short never looks complete. The space needed is checked first.
    """
    check_name(name)
    store = _Store(bucket, emulator, timeout, token_url)
    manifest = read_manifest(store, name)
    result, marker, missing, extra, body = _plan(name, manifest, dest_root, threads)
    dest = result.dest
    need = check_space(name, dest, missing, reserve_bytes)
    result.downloaded = sorted(item["path"] for item in missing)
    result.downloaded_bytes = need
    result.removed = sorted(extra)
    if not result.changed and _same_bytes(marker, body):
        return result
    if check_mode:
        result.marker_written = True
        return result
    _unmark(dest, marker, extra)

    def fetch(item: dict[str, Any]) -> None:
        local = os.path.join(dest, item["path"])
        os.makedirs(os.path.dirname(local), mode=0o755, exist_ok=True)
        tmp = f"{local}.forja-partial"
        digest = hashlib.sha256()
        try:
            with store.open(blob_object(item["sha256"])) as resp, open(tmp, "wb") as out:
                shutil.copyfileobj(_Hashing(resp, digest), out, _READ)
        except urllib.error.HTTPError:
            raise DatasetError("name", f"gs://{bucket}/{blob_object(item['sha256'])} (for {item['path']}) is "
                                       "missing from the bucket; push the dataset again") from None
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        if digest.hexdigest() != item["sha256"]:
            os.unlink(tmp)
            raise TransferError("checksum", f"{item['path']}: gs://{bucket}/{blob_object(item['sha256'])} "
                                            f"has SHA-256 {digest.hexdigest()}, not {item['sha256']} as the "
                                            "manifest says; push the dataset again")
        os.chmod(tmp, 0o644)
        os.replace(tmp, local)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for future in [pool.submit(fetch, item) for item in missing]:
            future.result()
    _mark(marker, body)
    result.marker_written = True
    return result


class _Hashing:
    """Reads through a response, hashing what passes (the check happens before the rename)."""

    def __init__(self, src: Any, digest: Any) -> None:
        self._src = src
        self._digest = digest

    def read(self, size: int = -1) -> bytes:
        data = self._src.read(size)
        self._digest.update(data)
        return bytes(data)


def stage_local(
    manifest_file: str,
    name: str,
    dest_root: str,
    phase: str,
    threads: int = 8,
    check_mode: bool = False,
    reserve_bytes: int = STAGE_RESERVE_BYTES,
) -> StageResult:
    """The host's two steps around a push straight to its disk (rsync from the controller, no bucket).

    ``prepare`` (before anything is sent): compare the folder with the manifest, refuse a disk too
    small for what is missing, remove the staged marker and the files the manifest does not list;
    ``downloaded`` names the files to send. ``verify`` (after): every file must now match its
    SHA-256 (a mismatch fails naming it); rsync's partial folder goes and the marker is written last.
    """
    check_name(name)
    try:
        with open(manifest_file, encoding="utf-8") as fh:
            manifest = check_manifest(json.load(fh), name, manifest_file)
    except (OSError, ValueError) as exc:
        raise DatasetError("manifest", f"cannot read {manifest_file} ({exc}); push again") from None
    result, marker, missing, extra, body = _plan(name, manifest, dest_root, threads)
    dest = result.dest
    if phase == "prepare":
        result.downloaded_bytes = check_space(name, dest, missing, reserve_bytes)
        result.downloaded = sorted(item["path"] for item in missing)
        result.removed = extra
        if check_mode or not (missing or extra):
            return result
        _unmark(dest, marker, extra)
        return result
    if missing:
        raise TransferError("checksum", f"{', '.join(sorted(i['path'] for i in missing)[:10])} in {dest} "
                                        "differ from the manifest after the transfer; push again")
    if extra:
        raise TransferError("dest", f"{', '.join(extra[:10])} in {dest} are not in the manifest; push again")
    if _same_bytes(marker, body):
        return result
    result.marker_written = True
    if check_mode:
        return result
    shutil.rmtree(os.path.join(dest, PARTIAL_DIR), ignore_errors=True)
    _mark(marker, body)
    return result
