"""What `forja down --delete` will remove, and what it leaves, said before it removes anything.

Why: a deletion cannot be undone, and what it removes is not only a VM. Its boot disk goes with it
(the checkpoints on it that never reached a bucket too), and so does that disk's monthly bill. The
bucket stays. An interactive "are you sure?" would break non-TTY use (cron, scripts, the API), so
the plan is said instead: printed before the play runs, an `Announcement` for the API's listeners,
and in `--json`. The VMs are those playbooks/teardown.yml deletes, read the way it finds them
(playbooks/observe.yml: the gcp_instance role's VM, every member of a cluster), priced by forja.cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from forja import contract, datasets, errors
from forja import format as fmt
from forja.session import Session


@dataclass(frozen=True)
class Removed:
    """One VM the deletion removes, with its boot disk and what that disk costs a month."""

    vm: str
    zone: str
    status: str
    boot_disk_size_gb: int
    disk_usd_per_month: float | None


@dataclass(frozen=True)
class DeletionPlan:
    """The VMs (and their boot disks) `down --delete` removes, and what it leaves (the buckets)."""

    removes: list[Removed] = field(default_factory=list)
    keeps: list[str] = field(default_factory=list)
    #: Why the VMs could not be listed ("" when they were): the deletion still goes as asked.
    unknown: str = ""

    @property
    def disk_usd_per_month(self) -> float:
        return sum(r.disk_usd_per_month or 0.0 for r in self.removes)

    def text(self) -> str:
        """The plan in one paragraph for people."""
        if self.unknown:
            said = f"deletes the VM(s) playbooks/teardown.yml names (not listed: {self.unknown})"
        elif not self.removes:
            said = "finds no VM to delete"
        else:
            vms = "; ".join(
                f"{r.vm} ({r.zone}, {r.status}) with its {r.boot_disk_size_gb} GB boot disk"
                + (f", {fmt.money(r.disk_usd_per_month)}/month" if r.disk_usd_per_month is not None else "")
                for r in self.removes)
            saved = fmt.money(self.disk_usd_per_month)
            said = (f"deletes {vms}: {saved}/month of disk no longer billed, and anything on those disks "
                    "that is not in a bucket is gone")
        kept = f"; keeps {', '.join(self.keeps)} and what is in it" if self.keeps else ""
        return f"down --delete {said}{kept}"

    def as_dict(self) -> dict[str, Any]:
        return {"removes": [asdict(r) for r in self.removes], "keeps": self.keeps,
                "disk_usd_per_month": self.disk_usd_per_month, "unknown": self.unknown}


def plan(session: Session, extravars: Mapping[str, Any] | None = None) -> DeletionPlan:
    """What `down(delete=True)` with these extravars removes: the VMs it deletes, each with its boot
    disk and that disk's monthly cost, and the buckets it leaves. Changes nothing."""
    keeps = _buckets(session)
    try:
        observed = session.run("observe.yml", extravars, check=False)
        found = contract.read_stats(observed.artifact_data).instances
    except errors.ForjaError as exc:
        return DeletionPlan(keeps=keeps, unknown=str(exc).splitlines()[0])
    removes = [Removed(name, vm.zone, vm.status, vm.boot_disk_size_gb, _disk_month(name, vm))
               for name, vm in found.items() if vm.exists]
    return DeletionPlan(removes, keeps)


def _disk_month(name: str, vm: contract.InstanceState) -> float | None:
    """The boot disk's monthly cost at forja's prices (None when it cannot be priced)."""
    from forja.cost import PriceError, load_prices
    from forja.cost.spend import Instance, disk_month_usd

    if not vm.boot_disk_size_gb:
        return None
    try:
        record = Instance.from_mapping({"name": name, "zone": vm.zone, "machine_type": vm.machine_type,
                                        "boot_disk_size_gb": vm.boot_disk_size_gb})
        return round(disk_month_usd([record], load_prices()), 4)
    except (PriceError, ValueError, KeyError):
        return None


def _buckets(session: Session) -> list[str]:
    """The buckets the inventory names (the checkpoint bucket, the project's): a deletion leaves them."""
    try:
        hostvars = datasets.first_host_vars(session)
    except errors.ForjaError:
        return []
    named = [str(hostvars.get("trainer_run_checkpoint_bucket") or ""),
             f"gs://{hostvars['gcp_bucket_name']}" if hostvars.get("gcp_bucket_name") else ""]
    return list(dict.fromkeys(b for b in named if b and "{{" not in b))
