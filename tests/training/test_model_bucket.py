"""The exported model delivered beside the run's checkpoints in the bucket (trainer.export.upload_model).

Against the sandbox's storage emulator, reached by Google's own client through STORAGE_EMULATOR_HOST,
as a VM reaches Cloud Storage.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import REPO, objects, subprocess_env, tiny_digits

from forja_sandbox.storage_emulator import StorageEmulator
from trainer import run_folder
from trainer.config import validate
from trainer.export import CONFIG, WEIGHTS
from trainer.train import train

storage = pytest.importorskip("google.cloud.storage")


def test_a_finished_run_puts_its_model_beside_its_checkpoints_with_model_json_vouching_for_it(
    tmp_path: Path, bucket: Any
) -> None:
    train(validate(tiny_digits(tmp_path, steps=10, checkpoint_bucket=f"gs://{bucket.name}/exp")))
    stored = objects(bucket, "exp/run/model/")
    assert sorted(stored) == ["exp/run/model/model.json", "exp/run/model/model.safetensors"]
    local = tmp_path / "run" / run_folder.MODEL_DIR
    assert stored["exp/run/model/model.safetensors"] == (local / WEIGHTS).read_bytes()
    info = json.loads(stored["exp/run/model/model.json"])
    assert info == json.loads((local / CONFIG).read_text())
    assert info["sha256"] == hashlib.sha256(stored["exp/run/model/model.safetensors"]).hexdigest()
    [event] = [e for e in map(json.loads, (tmp_path / "run" / run_folder.EVENTS).read_text().splitlines())
               if e["event"] == "export"]  # fmt: skip
    assert event["bucket"] == f"gs://{bucket.name}/exp/run/model/"


def test_export_on_request_replaces_the_buckets_model_and_leaves_no_partial_upload(
    tmp_path: Path, bucket: Any, emulator: StorageEmulator
) -> None:
    url = f"gs://{bucket.name}/exp"
    train(validate(tiny_digits(tmp_path, steps=10, checkpoint_every_steps=5, checkpoint_bucket=url)))
    first = objects(bucket, "exp/run/model/")
    train(validate(tiny_digits(tmp_path, steps=20, checkpoint_every_steps=5, export_model=False)))
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "export", str(tmp_path / "run"), "--bucket", url], cwd=REPO,
        env=subprocess_env(STORAGE_EMULATOR_HOST=emulator.url, FORJA_RUN="run"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    second = objects(bucket, "exp/run/")
    assert not [name for name in second if "/.partial/" in name]
    info = json.loads(second["exp/run/model/model.json"])
    assert info["step"] == 20 and json.loads(first["exp/run/model/model.json"])["step"] == 10
    assert info["sha256"] == hashlib.sha256(second["exp/run/model/model.safetensors"]).hexdigest()
