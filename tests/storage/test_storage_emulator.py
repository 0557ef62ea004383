"""What forja relies on from Cloud Storage, checked through Google's own client (google-cloud-storage)
against the sandbox's emulator (forja_sandbox/storage_emulator.py: gcp-storage-emulator plus its
shim). Where the emulator differs from real GCS is forja_sandbox/README.md's list; a test here fails
when a feature forja uses stops behaving as GCS documents it."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from forja_sandbox.service import PROJECT
from forja_sandbox.storage_emulator import BridgeRelay, StorageEmulator

CHUNK = 256 * 1024  # the client's smallest chunk size: a multiple of 256 KiB, as GCS requires


def test_a_resumable_upload_larger_than_its_chunk_arrives_whole(
    client: storage.Client, bucket_name: str
) -> None:
    bucket = client.create_bucket(bucket_name)
    data = os.urandom(3 * CHUNK + 17)
    blob = bucket.blob("runs/r1/step-00010.pt", chunk_size=CHUNK)
    blob.upload_from_string(data)
    stored = bucket.get_blob("runs/r1/step-00010.pt")
    assert stored is not None and stored.size == len(data)
    assert stored.download_as_bytes() == data
    assert stored.crc32c and stored.md5_hash


def test_if_generation_match_zero_refuses_to_overwrite_an_existing_object(
    client: storage.Client, bucket_name: str
) -> None:
    bucket = client.create_bucket(bucket_name)
    bucket.blob("marker").upload_from_string(b"first", if_generation_match=0)
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("marker").upload_from_string(b"second", if_generation_match=0)
    with pytest.raises(exceptions.PreconditionFailed):  # the resumable path checks it too
        bucket.blob("marker", chunk_size=CHUNK).upload_from_string(
            os.urandom(2 * CHUNK), if_generation_match=0)
    assert bucket.blob("marker").download_as_bytes() == b"first"


def test_if_generation_match_a_generation_accepts_it_once(client: storage.Client, bucket_name: str) -> None:
    bucket = client.create_bucket(bucket_name)
    bucket.blob("latest").upload_from_string(b"v1")
    first = bucket.get_blob("latest").generation
    bucket.blob("latest").upload_from_string(b"v2", if_generation_match=first)
    second = bucket.get_blob("latest").generation
    assert second != first
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("latest").upload_from_string(b"v3", if_generation_match=first)
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("latest").delete(if_generation_match=first)
    assert bucket.blob("latest").download_as_bytes() == b"v2"
    bucket.blob("latest").delete(if_generation_match=second)
    assert bucket.get_blob("latest") is None


def test_copy_and_compose_honour_the_destination_precondition(
    client: storage.Client, bucket_name: str
) -> None:
    bucket = client.create_bucket(bucket_name)
    bucket.blob("tmp/a").upload_from_string(b"AA")
    bucket.blob("tmp/b").upload_from_string(b"BB")
    bucket.copy_blob(bucket.blob("tmp/a"), bucket, "final/a", if_generation_match=0)
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.copy_blob(bucket.blob("tmp/b"), bucket, "final/a", if_generation_match=0)
    bucket.blob("final/ab").compose([bucket.blob("tmp/a"), bucket.blob("tmp/b")], if_generation_match=0)
    assert bucket.blob("final/ab").download_as_bytes() == b"AABB"
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("final/ab").compose([bucket.blob("tmp/b")], if_generation_match=0)
    assert bucket.blob("final/a").download_as_bytes() == b"AA"


def test_listing_with_prefix_and_delimiter_gives_objects_and_subfolders(
    client: storage.Client, bucket_name: str
) -> None:
    bucket = client.create_bucket(bucket_name)
    for name in ("runs/r1/step-1/model.pt", "runs/r1/step-2/model.pt", "runs/r1/latest", "runs/r2/x"):
        bucket.blob(name).upload_from_string(b"1")
    page = client.list_blobs(bucket, prefix="runs/r1/", delimiter="/")
    assert [b.name for b in page] == ["runs/r1/latest"]
    assert sorted(page.prefixes) == ["runs/r1/step-1/", "runs/r1/step-2/"]
    assert sorted(b.name for b in client.list_blobs(bucket, prefix="runs/")) == [
        "runs/r1/latest", "runs/r1/step-1/model.pt", "runs/r1/step-2/model.pt", "runs/r2/x"]


def test_custom_metadata_is_kept_and_a_deleted_object_is_gone(
    client: storage.Client, bucket_name: str
) -> None:
    bucket = client.create_bucket(bucket_name)
    blob = bucket.blob("runs/r1/step-1.done")
    blob.metadata = {"sha256": "ab" * 32}
    blob.upload_from_string(b"")
    assert bucket.get_blob("runs/r1/step-1.done").metadata == {"sha256": "ab" * 32}
    bucket.blob("runs/r1/step-1.done").delete()
    with pytest.raises(exceptions.NotFound):
        bucket.blob("runs/r1/step-1.done").download_as_bytes()
    with pytest.raises(exceptions.NotFound):
        bucket.blob("runs/r1/step-1.done").delete()


def test_bucket_settings_sent_at_creation_and_patched_later_are_kept(
    client: storage.Client, bucket_name: str
) -> None:
    bucket = client.bucket(bucket_name)
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.iam_configuration.public_access_prevention = "enforced"
    bucket.add_lifecycle_delete_rule(age=7, matches_prefix=["checkpoints/"])
    client.create_bucket(bucket, location="europe-west4")
    got = client.get_bucket(bucket_name)
    assert got.location == "EUROPE-WEST4"
    assert got.iam_configuration.uniform_bucket_level_access_enabled is True
    assert got.iam_configuration.public_access_prevention == "enforced"
    assert [r["condition"] for r in got.lifecycle_rules] == [{"age": 7, "matchesPrefix": ["checkpoints/"]}]
    created = int(got.metageneration)
    got.clear_lifecyle_rules()
    got.patch()
    again = client.get_bucket(bucket_name)
    assert list(again.lifecycle_rules) == []
    assert int(again.metageneration) > created
    with pytest.raises(exceptions.Conflict):
        client.create_bucket(bucket_name)


def test_a_bucket_iam_policy_is_stored_and_read_back(client: storage.Client, bucket_name: str) -> None:
    bucket = client.create_bucket(bucket_name)
    member = "serviceAccount:vm@forja-sandbox.iam.gserviceaccount.com"
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.bindings.append({"role": "roles/storage.objectAdmin", "members": {member}})
    bucket.set_iam_policy(policy)
    read = bucket.get_iam_policy(requested_policy_version=3)
    assert {b["role"]: set(b["members"]) for b in read.bindings} == {"roles/storage.objectAdmin": {member}}


def test_objects_survive_a_kill_and_a_restart_on_the_same_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = StorageEmulator(data_dir=tmp_path / "gcs").start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", store.url)
        client = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
        client.create_bucket("forja-survives").blob("a").upload_from_string(b"kept")
        port = store.port
        store.kill()
        assert not store.answers()
        store.start()
        assert store.port == port
        assert client.bucket("forja-survives").blob("a").download_as_bytes() == b"kept"
    finally:
        store.stop()
    assert not store.answers()


def test_without_a_data_dir_nothing_survives_a_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    with StorageEmulator() as store:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", store.url)
        client = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
        client.create_bucket("forja-memory")
        store.stop()
        store.start()
        assert client.lookup_bucket("forja-memory") is None


def test_the_bridge_relay_reaches_the_same_store(client: storage.Client, emulator: StorageEmulator,
                                                 bucket_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the sandbox's VMs use (service._serve_storage_on_bridge), here on another loopback address;
    resumable upload URLs must come back through the relay (the emulator builds them from Host)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    relay = BridgeRelay("127.0.0.2", port, (emulator.host, emulator.port)).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.2:{port}")
        via_relay = storage.Client(project=PROJECT, credentials=AnonymousCredentials())
        data = os.urandom(2 * CHUNK + 1)
        via_relay.create_bucket(bucket_name).blob("x", chunk_size=CHUNK).upload_from_string(data)
    finally:
        relay.stop()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    assert client.bucket(bucket_name).blob("x").download_as_bytes() == data
