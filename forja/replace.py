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

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forja import errors
from forja.history import History

if TYPE_CHECKING:
    from forja.session import Session

#: trainer_run's task that moves a replaced run's host folder aside (tasks/main.yml): whether the
#: host was touched when a `--replace` play fails.
SET_ASIDE_TASK = "Set the replaced run's folder aside"
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


@dataclass(frozen=True)
class SetAside:
    """A replaced run's new name, and the bucket its checkpoints were moved in (None: no bucket)."""

    aside: str
    bucket: str | None


def set_aside(session: Session, name: str, config: Path, extravars: Mapping[str, Any]) -> SetAside | None:
    """`--replace`: keep the ended run `name` as `<name>-replaced-<UTC time>`: its history row and
    events, fetched results and bucket checkpoints here, its VM folder by the role (SET_ASIDE_TASK),
    so the new run starts with nothing of it. None when there is no such run; a running one is
    refused. `config` is the new run's (it may name the checkpoint bucket)."""
    from forja import datasets

    try:
        old = session.history.get(name)
    except errors.RunNotFound:
        return None
    if old.ended_at is None:
        raise errors.ConfigError(
            "replace", f"run {name!r} is {old.status}, not ended: stop it first (forja stop {name}), "
            "then --replace it")
    aside = SetAside(aside_name(name), checkpoint_bucket(session, config, extravars))
    if aside.bucket is not None:
        try:
            move_bucket_run(datasets.storage_client(session, aside.bucket), aside.bucket, name, aside.aside)
        except Exception as exc:  # google-cloud-storage's errors, auth's, the network's: say which
            why = datasets.dataset_module().api_message(exc)  # Google's words, as a push says them
            raise errors.ForjaError(
                f"--replace could not move run {name!r}'s checkpoints in {aside.bucket} to "
                f"{aside.aside!r} ({type(exc).__name__}: {why}); nothing was sent. Objects already "
                f"moved are under {aside.bucket}/{aside.aside}/: move them back, or use a new --name"
            ) from exc
    move_run(session.history, session.results_dir, name, aside.aside)
    return aside


def put_back(session: Session, aside: SetAside, name: str) -> None:
    """Undo `set_aside` when the play refused the replacement before touching the host."""
    from forja import datasets

    session.history.drop(name)
    move_run(session.history, session.results_dir, aside.aside, name)
    if aside.bucket is not None:
        move_bucket_run(datasets.storage_client(session, aside.bucket), aside.bucket, aside.aside, name)


def checkpoint_bucket(session: Session, config: Path, extravars: Mapping[str, Any]) -> str | None:
    """Where the new run mirrors its checkpoints, as the trainer decides it (trainer/mirror.py):
    the config's checkpoint_bucket, else trainer_run_checkpoint_bucket (-e, else the inventory's);
    None when there is none."""
    import yaml

    from forja import datasets

    with contextlib.suppress(OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        configured = yaml.safe_load(config.read_text()).get("checkpoint_bucket")
        if configured:
            return str(configured)
    if "trainer_run_checkpoint_bucket" in extravars:
        return str(extravars["trainer_run_checkpoint_bucket"] or "") or None
    found = datasets.first_host_vars(session).get("trainer_run_checkpoint_bucket")
    return str(found) if found and "{{" not in str(found) else None
