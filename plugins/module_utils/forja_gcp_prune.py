# Copyright: forja contributors
# Apache-2.0
"""The stopped-disk prune's rules: when a VM that has stayed stopped may be deleted, and why not.

Why a prune at all: a stopped VM runs nothing, so nothing on it can delete it, and Compute Engine has
no "delete after N days stopped"; yet its boot disk bills every month (about $30 for forja's 300 GB
pd-balanced). The controller therefore prunes (the gcp_gpu_prune module, playbooks/prune.yml,
`forja prune`): a VM TERMINATED for longer than its ``autostop_delete_after`` is deleted, but only when
what its disk holds that matters is also in the checkpoint bucket.

How that is known while the VM is stopped: just before it powers the VM off, the autostop agent
(roles/autostop/files/forja_autostop.py, ``mirror_record``) writes the guest attribute
``forja/mirror``: for each run on the disk, its newest checkpoint step and the objects the bucket must
hold for it (relative to the run's prefix ``gs://BUCKET/PREFIX/<run>/``: the checkpoint, its
completion marker, the run's logs and summary). Guest attributes outlive the stop and need no
credentials on the VM. The prune then checks that each of those objects is in the bucket.

Never delete on doubt: no bucket, no record, a record older than the VM's last start (it was stopped
by something other than autostop since), a record cut short, a record with no run, one object
missing, or a bucket that cannot be read: the VM is kept, and the caller is told why and what its disk
costs. Standard library only: forja's Python reads the same rules (forja.module_utils loads this file).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

try:  # Ansible ships the sibling with the module (AnsiballZ)
    from ansible_collections.forja.gpu.plugins.module_utils.forja_durations import FORM, words
    from ansible_collections.forja.gpu.plugins.module_utils.forja_durations import seconds as duration_seconds
except ImportError:  # forja's Python loads this file by path, and the sibling first
    from forja_durations import FORM, words  # type: ignore[no-redef]
    from forja_durations import seconds as duration_seconds  # type: ignore[no-redef]

#: The guest attribute (NAMESPACE/KEY) the autostop agent writes its mirror record to.
MIRROR_ATTRIBUTE = "forja/mirror"
#: The record's version; a newer one is a doubt (kept), never guessed at.
RECORD_VERSION = 1
#: How many missing objects a reason names (the rest are counted).
NAMED_MISSING = 3

#: What lets the prune delete a VM it kept: a bucket at all, or the runs mirrored and recorded.
BUCKET_FIX = "set a checkpoint bucket (trainer_run_checkpoint_bucket) so the runs are mirrored there"
MIRROR_FIX = ("let the runs finish mirroring to the bucket and autostop stop the VM (it records them just "
              "before the poweroff)")

#: What the prune decided for one VM.
DELETE = "delete"            # deleted (or, in a dry run, would be)
KEEP = "keep"                # due, but kept: a doubt (the warning says which and the fix)
WAIT = "wait"                # stopped, not for long enough yet
NOT_STOPPED = "not-stopped"  # running (or starting, stopping): nothing to prune
OFF = "off"                  # autostop_delete_after is "": never deleted
ACTIONS = (DELETE, KEEP, WAIT, NOT_STOPPED, OFF)


def parse_duration(text: Any, field_name: str = "autostop_delete_after") -> float | None:
    """Seconds for "7d", "36h", "90m" or "30s" (forja_durations, with a unit: a bare number could be
    read as minutes or days); None for "" (off); ValueError naming the field and the form."""
    if text is None or str(text).strip() == "":
        return None
    stated = str(text).strip()
    total = None if stated[-1:].isdigit() else duration_seconds(stated, field_name)
    if not total or total <= 0:
        raise ValueError(f"{field_name}: {text!r} is not a duration above 0 with its unit; {FORM}, "
                         "or '' to never delete a stopped VM")
    return total


def parse_time(stamp: str) -> datetime:
    """Compute Engine's RFC 3339 stamps ("2026-11-30T01:02:03.456-08:00", or "Z")."""
    value = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class RunClaim:
    """One run on the disk: its newest checkpoint step (None: it has none) and the objects the bucket
    must hold for it, relative to the run's prefix."""

    run: str
    step: int | None
    objects: tuple[str, ...]


@dataclass(frozen=True)
class MirrorRecord:
    """The autostop agent's record, written just before the poweroff."""

    time: datetime
    runs: tuple[RunClaim, ...]
    #: True when the agent had more runs than the guest attribute could hold: a doubt.
    more: bool = False


def read_record(text: str) -> MirrorRecord:
    """The record from its guest attribute value; ValueError for anything but version 1's shape."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("v") != RECORD_VERSION:
        raise ValueError(f"{MIRROR_ATTRIBUTE} is not a version {RECORD_VERSION} record")
    runs = []
    for item in data.get("runs") or []:
        run, step, objects = item.get("run"), item.get("step"), item.get("objects")
        if not isinstance(run, str) or not run or "/" in run:
            raise ValueError(f"{MIRROR_ATTRIBUTE}: a run without a valid name ({run!r})")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise ValueError(f"{MIRROR_ATTRIBUTE}: run {run}'s step is {step!r}")
        names_ok = isinstance(objects, list) and all(
            isinstance(o, str) and o and ".." not in o for o in objects)
        if not names_ok:
            raise ValueError(f"{MIRROR_ATTRIBUTE}: run {run}'s objects are not a list of names")
        runs.append(RunClaim(run, step, tuple(objects)))
    return MirrorRecord(parse_time(str(data.get("time"))), tuple(runs), bool(data.get("more")))


def bucket_objects(bucket_url: str, record: MirrorRecord) -> tuple[str, list[str]]:
    """(bucket, the object names to find) for a record under ``gs://BUCKET/PREFIX`` (trainer/gcs.py's
    run_prefix: ``PREFIX/<run>/``)."""
    if not bucket_url.startswith("gs://"):
        raise ValueError(f"checkpoint bucket {bucket_url!r} is not gs://BUCKET/PREFIX")
    bucket, _slash, base = bucket_url[len("gs://"):].partition("/")
    base = base.strip("/")
    names = []
    for claim in record.runs:
        prefix = f"{base}/{claim.run}/" if base else f"{claim.run}/"
        names.extend(prefix + name for name in claim.objects)
    return bucket, names


@dataclass(frozen=True)
class Verdict:
    """What to do with one VM, and why, in a line for people."""

    action: str
    reason: str
    stopped_for_s: float | None = None
    checked: list[str] = field(default_factory=list)
    #: For a VM kept: what would let the prune delete it next time.
    fix: str = ""

    @property
    def due(self) -> bool:
        """Stopped past its delete_after: deleted, or kept for a doubt worth a warning."""
        return self.action in (DELETE, KEEP)


def judge(
    *,
    status: str,
    last_start: str | None,
    last_stop: str | None,
    now: datetime,
    delete_after_s: float | None,
    bucket_url: str,
    record_text: str | None,
    missing: Callable[[str, list[str]], list[str]],
) -> Verdict:
    """The prune's decision for one VM. `missing(bucket, names)` returns the names not in the bucket
    (and raises OSError/RuntimeError when it cannot tell: a doubt, so the VM is kept)."""
    if delete_after_s is None:
        return Verdict(OFF, "autostop_delete_after is off ('')")
    if status != "TERMINATED":
        return Verdict(NOT_STOPPED, f"it is {status or 'in no known state'}: only a stopped VM is pruned")
    if not last_stop:
        return Verdict(KEEP, "Compute Engine gives no time it stopped (lastStopTimestamp)")
    stopped_for = (now - parse_time(last_stop)).total_seconds()
    limit = f"autostop_delete_after {words(delete_after_s)}"
    if stopped_for < delete_after_s:
        return Verdict(WAIT, f"stopped {words(stopped_for)} of {limit}", stopped_for)

    def keep(why: str, checked: list[str] | None = None, fix: str = MIRROR_FIX) -> Verdict:
        return Verdict(KEEP, why, stopped_for, checked or [], fix)

    if not bucket_url:
        return keep("no checkpoint bucket (trainer_run_checkpoint_bucket) holds its checkpoints",
                    fix=BUCKET_FIX)
    if not record_text:
        return keep(f"autostop left no record of its checkpoints ({MIRROR_ATTRIBUTE}): it was not stopped by "
                    "autostop, or before the agent wrote one")
    try:
        record = read_record(record_text)
    except ValueError as exc:
        return keep(f"its checkpoint record cannot be read ({exc})")
    if last_start and record.time < parse_time(last_start).replace(microsecond=0):  # the record has seconds
        return keep(f"its checkpoint record ({record.time.isoformat()}) is older than its last start: it was "
                    "stopped by something other than autostop since")
    if record.more:
        return keep("it holds more runs than the checkpoint record could list")
    if not record.runs:
        return keep("nothing on it was mirrored: the record lists no run")
    try:
        bucket, names = bucket_objects(bucket_url, record)
        absent = missing(bucket, names)
    except (OSError, RuntimeError, ValueError) as exc:
        return keep(f"the bucket could not be checked ({exc})")
    if absent:
        shown = ", ".join(f"gs://{bucket}/{n}" for n in absent[:NAMED_MISSING])
        more = f" and {len(absent) - NAMED_MISSING} more" if len(absent) > NAMED_MISSING else ""
        return keep(f"not all of it is in the bucket: {shown}{more} missing", names)
    steps = ", ".join(f"{c.run} step {c.step}" if c.step is not None else f"{c.run} (no checkpoint)"
                      for c in record.runs)
    return Verdict(DELETE, f"stopped {words(stopped_for)} (over {limit}); in the bucket: {steps}",
                   stopped_for, names)


def kept_warning(vm: str, verdict: Verdict, disk_gb: int | None, disk_usd_month: float | None) -> str:
    """The warning for a VM kept past its delete_after: the VM, how long stopped, the disk's monthly
    cost, why, and the fix."""
    cost = (f"its {disk_gb} GB disk still bills ${disk_usd_month:,.2f}/month" if disk_usd_month is not None
            else "its disk still bills every month")
    stopped = words(verdict.stopped_for_s or 0.0)
    return (f"{vm}: stopped {stopped}, past autostop_delete_after, but kept: {verdict.reason}; {cost}. Fix: "
            f"{verdict.fix or MIRROR_FIX}, or delete it yourself: forja down --delete (ansible-playbook "
            "playbooks/teardown.yml -e forja_teardown_delete=true)")
