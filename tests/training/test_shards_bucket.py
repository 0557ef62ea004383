"""Shards streamed from a bucket (gs://BUCKET/datasets/NAME): verified, a few at a time, deleted after use.

Against the sandbox's storage emulator, reached by Google's own client through STORAGE_EMULATOR_HOST.
The dataset is laid out as `forja data push` lays it out (interface 1 of the dataset layout:
content-addressed blobs, manifest.json written last), here by the test itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import signal
from pathlib import Path
from typing import Any

import google_crc32c
import pytest
from shard_models import seen, write_digits_shards
from trainer_helpers import tiny_digits

from forja_sandbox.storage_emulator import StorageEmulator
from trainer.config import ConfigError, validate
from trainer.errors import UserCodeError
from trainer.train import train

storage = pytest.importorskip("google.cloud.storage")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_digits_shards(tmp_path_factory.mktemp("digits-shards"))


@pytest.fixture
def bucket(emulator: StorageEmulator, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator.url)
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[-60:].strip("-")  # parameters included
    return storage.Client().create_bucket(name)


def push(folder: Path, bucket: Any, name: str, damage: str | None = None) -> None:
    """Upload ``folder`` as dataset ``name``: blobs by sha256, then the manifest; ``damage``: the
    path of a file whose blob gets other bytes than the manifest's hash says."""
    files = []
    for path in sorted(p for p in folder.rglob("*.parquet")):
        data = path.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        rel = path.relative_to(folder).as_posix()
        crc = base64.b64encode(google_crc32c.Checksum(data).digest()).decode()
        files.append({"path": rel, "size": len(data), "sha256": sha, "crc32c": crc})
        body = data[:100] + bytes(100) + data[200:] if rel == damage else data  # same size, same footer
        bucket.blob(f"datasets/blobs/{sha}").upload_from_string(body)
    manifest = {
        "version": 1,
        "name": name,
        "created": "2026-11-25T00:00:00Z",
        "total_size": sum(f["size"] for f in files),
        "files": files,
    }
    bucket.blob(f"datasets/{name}/manifest.json").upload_from_string(json.dumps(manifest))


def config(tmp_path: Path, source: str, name: str, **overrides: Any) -> dict[str, Any]:
    return tiny_digits(
        tmp_path,
        model="shard_models:IdRecorder",
        model_args={"path": str(tmp_path / f"{name}.ids")},
        data="trainer.shards:dataset",
        data_args={
            "source": source,
            "eval": "eval",
            "shapes": {"image": [1, 8, 8]},
            "window_mb": 0.1,
            "cache_dir": str(tmp_path / "cache"),
        },
        out_dir=str(tmp_path / name),
        **overrides,
    )


def cached(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").rglob("*.parquet"))


def test_streamed_shards_train_in_the_local_order_and_are_deleted_after_use(
    tmp_path: Path, bucket: Any, shards: Path
) -> None:
    push(shards, bucket, "digits")
    on_disk: list[int] = []
    # one epoch: 1438 samples / 16 = 89 steps (a run that ends mid-epoch keeps what its next window needs)
    streamed = config(tmp_path, f"gs://{bucket.name}/datasets/digits", "streamed", steps=89)
    result = train(validate(streamed), on_step=lambda _: on_disk.append(len(cached(tmp_path))))
    assert result.status == "completed" and result.summary["accuracy"] > 0.5
    local = train(validate(config(tmp_path, str(shards), "local", steps=89)))
    assert local.status == "completed"
    assert seen(str(tmp_path / "streamed.ids")) == seen(str(tmp_path / "local.ids"))
    # never more than the shards a window and the next need (mix_shards 2, +1), of the 4; none left
    assert 0 < max(on_disk) <= 3 and cached(tmp_path) == []


def test_a_streamed_run_with_workers_resumes_at_the_exact_sample(
    tmp_path: Path, bucket: Any, shards: Path
) -> None:
    push(shards, bucket, "digits")
    source = f"gs://{bucket.name}/datasets/digits"
    straight = train(validate(config(tmp_path, source, "straight", steps=120, num_workers=2)))
    assert straight.status == "completed"
    stopped = validate(config(tmp_path, source, "stopped", steps=120, num_workers=2))

    def stop(step: int) -> None:
        if step == 30:
            signal.raise_signal(signal.SIGTERM)

    assert train(stopped, on_step=stop).status == "preempted"
    assert train(stopped).status == "completed"
    assert seen(str(tmp_path / "stopped.ids")) == seen(str(tmp_path / "straight.ids"))
    assert len(cached(tmp_path)) <= 3  # ended mid-epoch: at most what its next windows would read


def test_a_dataset_without_a_manifest_is_named(tmp_path: Path, bucket: Any, shards: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        train(validate(config(tmp_path, f"gs://{bucket.name}/datasets/never-pushed", "run")))
    (problem,) = exc.value.problems
    assert problem.startswith(f"data_args.source: gs://{bucket.name}/datasets/never-pushed/manifest.json")
    assert "forja data push" in problem


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shard_whose_hash_does_not_match_stops_the_run_and_is_not_kept(
    tmp_path: Path, bucket: Any, shards: Path, workers: int
) -> None:
    damaged = "train/shard-000002.parquet"
    push(shards, bucket, "digits", damage=damaged)
    sha = hashlib.sha256((shards / damaged).read_bytes()).hexdigest()
    source = f"gs://{bucket.name}/datasets/digits"
    with pytest.raises(
        UserCodeError, match=rf"shard {damaged} \(gs://.*/{sha}\) has sha256 [0-9a-f]{{64}}, not"
    ):
        train(validate(config(tmp_path, source, "run", steps=100, num_workers=workers)))
    # Nor a partial download of it. (Whether another shard is in the cache by then is a race between
    # the DataLoader workers: with two, the damaged shard can be the first one read.)
    # The first worker to find the damage notes it, so a second does not download it again (and
    # is not killed mid-download by the loader's shutdown, leaving a partial file).
    left = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert not [n for n in left if n.startswith(sha + ".parquet")], left
    push(shards, bucket, "digits")  # pushed again, whole: the note does not outlive it
    again = config(tmp_path, source, "again", steps=100, num_workers=workers)
    assert train(validate(again)).status == "completed"


def test_a_source_that_is_not_a_dataset_url_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"data_args\.source: a bucket dataset is gs://BUCKET/datasets/NAME"
    ):
        train(validate(config(tmp_path, "gs://some-bucket/elsewhere", "run")))
