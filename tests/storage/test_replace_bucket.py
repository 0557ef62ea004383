"""`forja train --replace` with checkpoints in a bucket: the old run's objects move to its new name.

The trainer resumes a run from gs://BUCKET/PREFIX/<run>/ (trainer/mirror.py): a new run under the old
name would resume from the old run's checkpoints. So `--replace` moves them, on the controller, to
`<run>-replaced-<time>/` before anything is sent, and moves them back when the play then fails before
the VM was touched. Real google-cloud-storage against the sandbox's storage emulator; the inventory's
host is 127.0.0.1 port 1, so the play fails unreachable, as a VM that is down would.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from google.cloud import storage

from forja import errors, replace
from forja.api import Forja
from forja.history import History
from forja_sandbox.storage_emulator import StorageEmulator

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "trainer" / "configs" / "digits.yaml"
OLD_RUN = ["checkpoints/digits/checkpoints/ckpt-300.pt", "checkpoints/digits/checkpoints/ckpt-300.done",
           "checkpoints/digits/logs/metrics.jsonl"]  # fmt: skip
OTHER_RUN = "checkpoints/digits-2/checkpoints/ckpt-10.pt"  # a run whose name starts the same


def _names(client: storage.Client, bucket: str) -> list[str]:
    return sorted(blob.name for blob in client.list_blobs(bucket))


@pytest.fixture
def filled(client: storage.Client, bucket_name: str) -> str:
    bucket = client.create_bucket(bucket_name)
    for name in [*OLD_RUN, OTHER_RUN]:
        bucket.blob(name).upload_from_string(name.encode())
    return bucket_name


def test_a_runs_objects_move_to_the_new_name_and_no_other_runs(client: storage.Client, filled: str) -> None:
    url = f"gs://{filled}/checkpoints"
    assert replace.move_bucket_run(client, url, "digits", "digits-replaced-20261129T112812") == 3
    moved = [name.replace("/digits/", "/digits-replaced-20261129T112812/") for name in OLD_RUN]
    assert _names(client, filled) == sorted([*moved, OTHER_RUN])
    blob = client.bucket(filled).blob(moved[0])
    assert blob.download_as_bytes() == OLD_RUN[0].encode()  # the bytes moved with the name


def _ghost(tmp_path: Path, emulator: StorageEmulator, bucket_url: str) -> Forja:
    """forja over a host nothing answers on, whose inventory names the bucket, with a completed run."""
    ghost = {"ansible_host": "127.0.0.1", "ansible_port": 1, "gcp_bucket_storage_emulator_host": emulator.url,
             "trainer_run_checkpoint_bucket": bucket_url}  # fmt: skip
    inventory = tmp_path / "inv.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"forja_gpu": {"hosts": {"ghost": ghost}}}}}))
    forja = Forja(project_dir=tmp_path, inventory=str(inventory), host_key_checking=False,
                  private_data_dir=tmp_path / "runner", history=History(tmp_path / "h.sqlite"))  # fmt: skip
    forja.history.start("digits", name="digits", hosts=["ghost"])
    forja.history.update("digits", status="completed", ended_at="2026-11-28T10:00:00+00:00", steps=300)
    return forja


def test_replace_moves_them_and_puts_them_back_when_the_host_never_took_it(
    client: storage.Client, filled: str, emulator: StorageEmulator, tmp_path: Path
) -> None:
    forja = _ghost(tmp_path, emulator, f"gs://{filled}/checkpoints")
    before = _names(client, filled)
    seen: list[list[str]] = []

    def look(event: object) -> None:  # while the play runs: the old run's objects are aside
        if not seen:
            seen.append(_names(client, filled))

    with pytest.raises(errors.HostUnreachable):
        forja.train(DIGITS, name="digits", replace=True, on_event=look)
    assert seen and not any(name.startswith("checkpoints/digits/") for name in seen[0]), seen
    assert sum(name.startswith("checkpoints/digits-replaced-") for name in seen[0]) == 3
    assert _names(client, filled) == before  # put back: the VM never took the replacement
    assert [r.run_id for r in forja.history.list()] == ["digits"]


def test_a_bucket_it_cannot_move_in_is_an_error_naming_it_and_nothing_is_sent(
    client: storage.Client, emulator: StorageEmulator, tmp_path: Path
) -> None:
    forja = _ghost(tmp_path, emulator, "gs://forja-no-such-bucket/checkpoints")
    before = (forja.history.get("digits"), forja.history.events("digits"))
    with pytest.raises(errors.ForjaError) as info:
        forja.train(DIGITS, name="digits", replace=True)
    assert "--replace could not move run 'digits''s checkpoints in gs://forja-no-such-bucket/checkpoints" \
        in info.value.message and "nothing was sent" in info.value.message
    assert (forja.history.get("digits"), forja.history.events("digits")) == before
