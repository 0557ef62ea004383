"""`forja prune`: delete the VMs that have stayed stopped past `autostop_delete_after`, never a disk in doubt.

Why from the controller: a stopped VM runs nothing, and Compute Engine cannot delete a VM after some
time stopped, yet its disk bills every month. So the prune is a play (playbooks/prune.yml, module
gcp_gpu_prune, whose rules are plugins/module_utils/forja_gcp_prune.py) that `ansible-playbook` users
run the same way; this module runs it, reads what it decided (forja/contract.py `PruneVerdict`), and
posts a `disk_deleted` event for each VM it deleted (forja/notify.py). Run it from cron or a systemd
timer (roles/autostop/README.md has both lines).

A VM its user stopped (`forja down`, or by hand) is kept, never deleted, however long it stays stopped:
decided so (issue 29's review). The prune is for what autostop found idle and nobody came back to;
`forja down` is a person's decision to come back, and only autostop's stop records, after the runs
checkpointed, what of the disk the bucket holds (its record of an earlier stop is older than the
VM's last start, so it says nothing of now). A disk nothing vouches for may hold what the bucket
does not (a dataset staged on it, a notebook's files, runs since), and a deletion cannot be undone.
What the kept disk costs is not hidden: each prune warns with how long the VM has been stopped, its
disk's monthly cost and the fix, `forja down --delete` (tests/gcp/test_prune.py's drill holds one).
To let the prune judge a VM stopped otherwise, leave autostop's record first on the VM:
/usr/local/lib/forja/forja_autostop.py --record-mirror (roles/autostop/files/forja_autostop.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from forja import contract, following
from forja import format as fmt
from forja import notify as notifications
from forja.contract import PruneVerdict
from forja.session import Session


@dataclass(frozen=True)
class PruneReport:
    """What the prune decided for each GPU VM of the inventory (by inventory name)."""

    dry_run: bool
    verdicts: dict[str, PruneVerdict] = field(default_factory=dict)

    @property
    def deleted(self) -> list[PruneVerdict]:
        return [v for v in self.verdicts.values() if v.deleted]

    @property
    def would_delete(self) -> list[PruneVerdict]:
        """In a dry run, the VMs a real prune would delete now."""
        return [v for v in self.verdicts.values() if v.action == "delete" and not v.deleted]

    @property
    def kept(self) -> list[PruneVerdict]:
        """Due for deletion but kept for a doubt: each has its warning (why, the monthly cost, the fix)."""
        return [v for v in self.verdicts.values() if v.action == "keep"]

    @property
    def saved_usd_per_month(self) -> float:
        return sum(v.disk_usd_per_month or 0.0 for v in self.deleted)

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of `forja --json prune`."""
        return {"dry_run": self.dry_run,
                "vms": {host: v.model_dump() for host, v in self.verdicts.items()},
                "deleted": [v.vm for v in self.deleted], "would_delete": [v.vm for v in self.would_delete],
                "kept": [v.vm for v in self.kept], "saved_usd_per_month": self.saved_usd_per_month}


def prune(
    session: Session,
    dry_run: bool = False,
    notify: str | bool | None = None,
    extravars: Mapping[str, Any] | None = None,
) -> PruneReport:
    """Delete each GPU VM that has stayed stopped longer than its `autostop_delete_after` (e.g. 7d;
    off by default), but only when its runs' newest checkpoints and results are in the checkpoint
    bucket: autostop records them on the VM just before it powers it off, and each object is looked
    for in the bucket. A VM that is due but in doubt (no bucket, no record, something missing) is
    kept, with a warning that names how long it has been stopped, what its disk costs a month and
    the fix; so is a VM its user stopped (`forja down`): only autostop's stop records what the bucket
    holds. `dry_run` says what would be deleted and why, and deletes nothing. `notify` posts a
    `disk_deleted` event for each VM deleted, as `train`'s `notify` does. Runs playbooks/prune.yml;
    run it from cron to make it automatic (roles/autostop/README.md).
    """
    following.notifications_for(session, notify)  # a missing or non-http(s) webhook: before anything
    result = session.run("prune.yml", {**(extravars or {}), "forja_prune_dry_run": dry_run})
    report = PruneReport(dry_run, contract.read_stats(result.artifact_data).prune)
    if session.notifier is not None and report.deleted:
        for verdict in report.deleted:
            session.notifier.send(deleted_event(verdict))
        session.notifier.drain()
    return report


def deleted_event(verdict: PruneVerdict) -> notifications.Event:
    """The `disk_deleted` event: the VM, a line for people, and the disk cost a month it saves."""
    saved = verdict.disk_usd_per_month
    per_month = f", saving {fmt.money(saved)}/month" if saved is not None else ""
    size = f"{verdict.boot_disk_size_gb} GB " if verdict.boot_disk_size_gb else ""
    text = f"{verdict.vm}: deleted with its {size}disk{per_month}: {verdict.reason}"
    return notifications.Event(
        "disk_deleted", "", text, vm=verdict.vm,
        details={"disk_usd_per_month_saved": saved, "boot_disk_size_gb": verdict.boot_disk_size_gb,
                 "stopped_for_s": verdict.stopped_for_s, "checked": verdict.checked})
