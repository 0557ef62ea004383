"""`forja train --replace`: an ended run's name, reused for a new run that starts afresh.

A run's name is its identity everywhere: its history row and events on the controller, its fetched
results (`forja-runs/<name>`), its folder and unit on the VM, and its checkpoints in a bucket
(`gs://BUCKET/PREFIX/<name>/`, where a run resumes from after a preemption). Replacing keeps the
old run whole under another name, `<name>-replaced-<UTC time>`, in every one of those places, so
the new run inherits nothing of it (no events, no checkpoint to resume from) and the old one can
still be listed, priced and fetched. The VM's folder is moved by trainer_run (its
`trainer_run_replaced_as`); the rest here, on the controller, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forja import errors
from forja.history import History

#: What the UTC time adds to a name (`-replaced-20261129T112812`); the name is cut to stay a run name (63).
SUFFIX_LEN = len("-replaced-") + len("20261129T112812")


def aside_name(name: str, now: datetime | None = None) -> str:
    """The name the replaced run keeps: `<name>-replaced-<UTC time>`, at most 63 characters."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%S")
    return f"{name[: 63 - SUFFIX_LEN]}-replaced-{stamp}"


def move_run(history: History, results_dir: Callable[[str], Path], old: str, new: str) -> None:
    """Run `old` becomes `new` on the controller: its history row and events, and its fetched
    results' folder (the recorded artifact_dir follows, to the same host folder inside)."""
    record = history.rename(old, new)
    source, target = results_dir(old), results_dir(new)
    if not source.is_dir() or target.exists():
        return
    source.rename(target)
    if record.artifact_dir and Path(record.artifact_dir).is_relative_to(source):
        history.update(new, artifact_dir=str(target / Path(record.artifact_dir).relative_to(source)))


def run_prefix(bucket_url: str, run: str) -> tuple[str, str]:
    """(bucket, `PREFIX/<run>/`): the trainer's own layout (trainer.gcs.run_prefix), what its mirror
    resumes from; a bad URL is the setting's error."""
    from trainer import gcs

    try:
        return gcs.run_prefix(bucket_url, run)
    except ValueError as exc:
        raise errors.ConfigError("trainer_run_checkpoint_bucket", str(exc)) from None


def move_bucket_run(client: Any, bucket_url: str, old: str, new: str) -> int:
    """Move every object of run `old` under the bucket's run prefix to run `new`'s (copy, then
    delete: Cloud Storage has no rename); the number moved. A move cut short is finished by the next
    call, which finds only what was left."""
    bucket_name, source = run_prefix(bucket_url, old)
    _, target = run_prefix(bucket_url, new)
    bucket = client.bucket(bucket_name)
    moved = 0
    for blob in client.list_blobs(bucket_name, prefix=source):
        bucket.copy_blob(blob, bucket, target + blob.name[len(source):])
        blob.delete()
        moved += 1
    return moved
