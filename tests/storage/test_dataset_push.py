"""`Forja.push_data` / `forja data push` against the sandbox's Cloud Storage emulator over real HTTP.

What the push wrote is read back with Google's own client (google-cloud-storage): the manifest, the
content-addressed blobs and their CRC32C. The staging (forja_dataset.stage, the code the
forja_dataset_stage module runs on a host) is exercised here against the same emulator; the role
on a real host is tests/storage/test_dataset_role.py.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import pytest
from google.cloud import storage

from forja import datasets, errors
from forja.api import Forja
from forja_sandbox.storage_emulator import StorageEmulator

MiB = 1024 * 1024
PEM = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def make_dataset(root: Path, small: int = 40) -> dict[str, bytes]:
    """Many small files, one large one (resumable, in chunks), and what must never leave."""
    files = {f"train/shard-{i:04d}.txt": f"sample {i}\n".encode() * (i + 1) for i in range(small)}
    files["train/big.bin"] = os.urandom(9 * MiB)
    files["train/dup.txt"] = files["train/shard-0001.txt"]  # same content: one blob for both
    files["README.md"] = b"digits\n"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / ".env").write_text("API_KEY=abc\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    (root / "train" / "notes.txt").write_bytes(PEM)  # a key under an innocent name
    return files


@pytest.fixture
def forja(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulator: StorageEmulator) -> Forja:
    monkeypatch.delenv("FORJA_INVENTORY", raising=False)
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    return Forja(inventory=None)


@pytest.fixture
def bucket(client: storage.Client, bucket_name: str) -> storage.Bucket:
    return client.create_bucket(bucket_name)


def manifest(bucket: storage.Bucket, name: str) -> dict:
    return json.loads(bucket.blob(f"datasets/{name}/manifest.json").download_as_bytes())


def test_first_push_then_a_second_sends_only_the_changed_file(forja, bucket, tmp_path) -> None:
    root = tmp_path / "digits"
    files = make_dataset(root)
    seen = []
    first = forja.push_data(root, bucket=f"gs://{bucket.name}", threads=4, on_progress=seen.append)

    assert first.url == f"gs://{bucket.name}/datasets/digits" and first.files == len(files)
    assert first.uploaded_files == len(files) - 1 and first.skipped_files == 0  # dup.txt shares a blob
    assert first.uploaded_bytes == sum(len(d) for d in files.values()) - len(files["train/dup.txt"])
    assert sorted(first.excluded) == [".env", ".git/", "train/notes.txt"]
    assert first.secrets_excluded == ["train/notes.txt"]
    uploads = [p for p in seen if p.phase == "upload"]
    assert uploads and uploads[-1].bytes_done >= first.uploaded_bytes
    assert uploads[-1].files_done == first.uploaded_files
    assert {p.phase for p in seen} == {"hash", "upload", "manifest"}

    listed = manifest(bucket, "digits")
    assert listed["version"] == 1 and listed["name"] == "digits" and listed["created"].endswith("Z")
    assert listed["total_size"] == sum(len(d) for d in files.values())
    assert {f["path"]: (f["size"], f["sha256"], f["crc32c"]) for f in listed["files"]} == {
        rel: (len(d), sha256(d), crc32c(d)) for rel, d in files.items()}
    for rel, data in files.items():  # each blob under its SHA-256, with the CRC32C the service computed
        blob = bucket.get_blob(f"datasets/blobs/{sha256(data)}")
        assert blob is not None and blob.crc32c == crc32c(data) and blob.size == len(data), rel
    assert bucket.blob(f"datasets/blobs/{sha256(files['train/big.bin'])}").download_as_bytes() == files[
        "train/big.bin"]
    never = {sha256(PEM), sha256(b"API_KEY=abc\n"), sha256(b"[core]\n")}
    assert not never & {b.name.rsplit("/", 1)[-1] for b in bucket.list_blobs(prefix="datasets/blobs/")}

    changed = b"sample 7 was relabelled\n"
    (root / "train" / "shard-0007.txt").write_bytes(changed)
    second = forja.push_data(root, bucket=f"gs://{bucket.name}")
    assert (second.uploaded_files, second.uploaded_bytes) == (1, len(changed)), second
    assert second.skipped_files == len(files) - 2 and second.manifest_written
    entry = next(f for f in manifest(bucket, "digits")["files"] if f["path"] == "train/shard-0007.txt")
    assert entry["sha256"] == sha256(changed)

    created = manifest(bucket, "digits")["created"]
    third = forja.push_data(root, bucket=f"gs://{bucket.name}")
    assert (third.uploaded_files, third.manifest_written) == (0, False)
    assert manifest(bucket, "digits")["created"] == created


def test_the_cli_pushes_and_prints_what_it_sent(emulator, bucket, tmp_path) -> None:
    root = tmp_path / "cli-data"
    make_dataset(root, small=3)
    env = {**os.environ, "STORAGE_EMULATOR_HOST": emulator.url, "FORJA_HOME": str(tmp_path / "home")}
    env.pop("FORJA_INVENTORY", None)
    cmd = [str(Path(sys.executable).with_name("forja")), "--json", "data", "push", str(root),
           "--name", "cli-v1", "--bucket", f"gs://{bucket.name}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["url"] == f"gs://{bucket.name}/datasets/cli-v1"
    assert result["uploaded_files"] == 5  # 6 files: dup.txt shares a blob
    assert bucket.blob("datasets/cli-v1/manifest.json").exists()
    table = cmd[:1] + cmd[2:]  # without --json: the table
    done = subprocess.run(table, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "already there" in done.stdout, done.stdout + done.stderr


def test_an_interrupted_push_leaves_no_manifest_and_the_next_one_resumes(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("FORJA_INVENTORY", raising=False)
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    root = tmp_path / "big"
    files = make_dataset(root, small=60)
    with StorageEmulator(data_dir=tmp_path / "gcs") as emu:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", emu.url)
        gcs = datasets.dataset_module().make_client(None, emu.url)
        bucket = gcs.create_bucket("forja-interrupted")
        forja = Forja(inventory=None)
        killed = threading.Event()

        def crash_after_ten_files(progress) -> None:
            if progress.phase == "upload" and progress.files_done >= 10 and not killed.is_set():
                killed.set()
                emu.kill()  # the store goes away mid-push, as an outage does

        with pytest.raises(errors.ForjaError) as failed:
            forja.push_data(root, bucket="gs://forja-interrupted", threads=2, retry_deadline_s=2,
                            on_progress=crash_after_ten_files)
        assert killed.is_set()
        assert "did not answer" in failed.value.message and "push again" in failed.value.message
        emu.start()  # same port, same data
        assert not bucket.blob("datasets/big/manifest.json").exists(), "a partial push looks complete"
        kept = [b.name for b in bucket.list_blobs(prefix="datasets/blobs/")]
        assert 10 <= len(kept) < len(files) - 1

        again = forja.push_data(root, bucket="gs://forja-interrupted")
        assert again.skipped_files == len(kept) and again.uploaded_files == len(files) - 1 - len(kept)
        assert len(manifest(bucket, "big")["files"]) == len(files)
        for data in files.values():
            assert bucket.blob(f"datasets/blobs/{sha256(data)}").download_as_bytes() == data


def test_a_blob_with_the_wrong_content_is_sent_again(forja, bucket, tmp_path) -> None:
    root = tmp_path / "tampered"
    root.mkdir()
    good = b"the real shard\n" * 100
    (root / "shard.txt").write_bytes(good)
    bucket.blob(f"datasets/blobs/{sha256(good)}").upload_from_string(b"something else entirely")
    result = forja.push_data(root, bucket=f"gs://{bucket.name}")
    assert result.uploaded_files == 1 and result.skipped_files == 0
    assert bucket.blob(f"datasets/blobs/{sha256(good)}").download_as_bytes() == good


class _Corrupting(http.server.BaseHTTPRequestHandler):
    """A proxy in front of the emulator that flips one byte of every upload body on the way (a bad NIC)."""

    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        import urllib.error
        import urllib.request

        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if "upload" in self.path and b"the payload" in body:
            at = body.index(b"the payload")
            body = body[:at] + b"T" + body[at + 1:]
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        request = urllib.request.Request(self.server.target + self.path, data=body or None,  # type: ignore[attr-defined]
                                         headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                status, out, reply = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as exc:
            status, out, reply = exc.code, exc.read(), exc.headers
        self.send_response(status)
        for k, v in reply.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def corrupting(emulator: StorageEmulator) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Corrupting)
    server.target = emulator.url  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_bytes_changed_on_the_way_are_caught_and_nothing_looks_complete(
    corrupting, bucket, tmp_path, monkeypatch
) -> None:
    root = tmp_path / "wire"
    root.mkdir()
    (root / "a.txt").write_bytes(b"the payload of a\n")
    monkeypatch.delenv("FORJA_INVENTORY", raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", corrupting)
    with pytest.raises(errors.ForjaError) as failed:
        Forja(inventory=None).push_data(root, bucket=f"gs://{bucket.name}", retry_deadline_s=2)
    assert failed.value.message.startswith("checksum: a.txt:"), failed.value.message
    assert not bucket.blob("datasets/wire/manifest.json").exists()
    kept = [b.download_as_bytes() for b in bucket.list_blobs(prefix="datasets/blobs/")]
    assert all(data == b"the payload of a\n" for data in kept), kept


def test_bad_input_is_refused_naming_the_field_before_anything_is_written(forja, bucket, tmp_path) -> None:
    url = f"gs://{bucket.name}"
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "only-secrets").mkdir()
    (tmp_path / "only-secrets" / ".env").write_text("TOKEN=1\n")
    cases = [
        (lambda: forja.push_data(tmp_path / "missing", bucket=url), "path", "does not exist"),
        (lambda: forja.push_data(tmp_path / "a-file", bucket=url), "path", "is a file, not a folder"),
        (lambda: forja.push_data(tmp_path / "only-secrets", bucket=url), "path", "holds no file to push"),
        (lambda: forja.push_data(tmp_path, name="no spaces", bucket=url), "name", "is not a dataset name"),
        (lambda: forja.push_data(tmp_path, bucket="s3://elsewhere"), "bucket", "give gs://BUCKET"),
        (lambda: forja.push_data(tmp_path, bucket="gs://forja-no-such-bucket"), "bucket", "does not exist"),
    ]
    for call, field, words in cases:
        with pytest.raises(errors.ConfigError) as refused:
            call()
        assert refused.value.field == field and words in refused.value.message, refused.value.message
        assert refused.value.exit_code == 2
    assert list(bucket.list_blobs()) == []


class _Forbidden(http.server.BaseHTTPRequestHandler):
    """Cloud Storage's answer to credentials without access (as in tests/storage/test_bucket_module.py)."""

    def do_GET(self) -> None:
        self.server.asked.append((self.command, self.path))  # type: ignore[attr-defined]
        body = json.dumps({"error": {"code": 403, "message": "forja-ci@forja-sandbox.iam.gserviceaccount.com "
                                     "does not have storage.objects.get access to the Google Cloud Storage "
                                     "object. Permission 'storage.objects.get' denied on resource (or it may "
                                     "not exist).",
                                     "errors": [{"reason": "forbidden"}]}}).encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_a_bucket_without_access_is_refused_before_anything_is_sent(tmp_path, monkeypatch) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    server.asked = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv("FORJA_INVENTORY", raising=False)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_address[1]}")
        root = tmp_path / "theirs"
        make_dataset(root, small=2)
        with pytest.raises(errors.ConfigError) as refused:
            Forja(inventory=None).push_data(root, bucket="gs://someone-elses-bucket")
    finally:
        server.shutdown()
        server.server_close()
    msg = refused.value.message
    assert msg.startswith("bucket:") and "403" in msg and "storage.objects.get" in msg, msg
    assert "roles/storage.objectAdmin" in msg
    assert server.asked and all(method == "GET" for method, _ in server.asked), server.asked  # type: ignore[attr-defined]


# --- staging (the host side's code, run here against the same emulator) ---------------------------
def test_staging_verifies_each_file_repairs_drift_and_catches_a_corrupt_blob(forja, bucket, tmp_path) -> None:
    root = tmp_path / "staged-src"
    files = make_dataset(root, small=5)
    forja.push_data(root, name="stage-me", bucket=f"gs://{bucket.name}")
    mod = datasets.dataset_module()
    emulator = os.environ["STORAGE_EMULATOR_HOST"]
    dest = tmp_path / "data"

    first = mod.stage(bucket.name, "stage-me", str(dest), emulator=emulator)
    assert first.changed and sorted(first.downloaded) == sorted(files)
    for rel, data in files.items():
        assert (dest / "stage-me" / rel).read_bytes() == data
    assert (dest / "stage-me" / mod.STAGED_MARKER).is_file()
    again = mod.stage(bucket.name, "stage-me", str(dest), emulator=emulator)
    assert not again.changed

    (dest / "stage-me" / "README.md").unlink()
    (dest / "stage-me" / "train" / "shard-0002.txt").write_bytes(b"same size? no: altered\n")
    (dest / "stage-me" / "stray.tmp").write_text("left over\n")
    repaired = mod.stage(bucket.name, "stage-me", str(dest), emulator=emulator)
    assert sorted(repaired.downloaded) == ["README.md", "train/shard-0002.txt"]
    assert repaired.removed == ["stray.tmp"]
    assert (dest / "stage-me" / "train" / "shard-0002.txt").read_bytes() == files["train/shard-0002.txt"]

    # A blob altered in the bucket after the push: the host's SHA-256 check refuses it, and the staged
    # dataset no longer looks complete (the marker goes first, and is not written again).
    bucket.blob(f"datasets/blobs/{sha256(files['README.md'])}").upload_from_string(b"tampered\n")
    (dest / "stage-me" / "README.md").unlink()
    with pytest.raises(mod.TransferError) as bad:
        mod.stage(bucket.name, "stage-me", str(dest), emulator=emulator)
    assert bad.value.field == "checksum" and "README.md" in bad.value.message
    assert not (dest / "stage-me" / "README.md").exists()
    assert not (dest / "stage-me" / mod.STAGED_MARKER).exists()

    with pytest.raises(mod.DatasetError) as missing:
        mod.stage(bucket.name, "never-pushed", str(dest), emulator=emulator)
    assert missing.value.field == "name" and "push it first" in missing.value.message


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs), standing in for a VM's disk with little space left."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    where = tmp_path / "small-disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_staging_more_than_the_disk_holds_is_refused_before_anything_changes(forja, bucket, tmp_path,
                                                                              small_disk) -> None:
    root = tmp_path / "too-big"
    make_dataset(root, small=2)  # 9 MiB and more
    forja.push_data(root, bucket=f"gs://{bucket.name}")
    mod = datasets.dataset_module()
    with pytest.raises(mod.DatasetError) as refused:
        mod.stage(bucket.name, "too-big", str(small_disk), emulator=os.environ["STORAGE_EMULATOR_HOST"])
    assert refused.value.field == "dest" and "grow the VM's disk" in refused.value.message
    assert list(small_disk.iterdir()) == []


def test_the_bucket_and_the_emulator_come_from_the_inventory_when_not_given(
    emulator, bucket, tmp_path, monkeypatch
) -> None:
    """As in inventory/sandbox: dataset_bucket refers to gcp_bucket_name, read through it untemplated."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"forja_gpu": {"hosts": {"vm1": {"ansible_host": "127.0.0.1"}}, "vars": {
        "gcp_bucket_name": bucket.name, "dataset_bucket": "gs://{{ gcp_bucket_name }}",
        "gcp_bucket_storage_emulator_host": emulator.url}}}))
    root = tmp_path / "from-inventory"
    make_dataset(root, small=2)
    result = Forja(inventory=str(inventory)).push_data(root)
    assert result.url == f"gs://{bucket.name}/datasets/from-inventory"
    assert bucket.blob("datasets/from-inventory/manifest.json").exists()
