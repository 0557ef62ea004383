"""Spend: what an instance has cost, from its running intervals and its disks.

Compute Engine bills a VM per second while it is RUNNING, with a one-minute minimum each time it
starts, and bills its persistent disks all the time, stopped or not. A stopped VM therefore still
costs its disk: the report shows that figure separately because it is the one people forget.

Inputs are plain dicts (an inventory's hostvars or the Compute API's instance JSON), so the
computation is testable with known numbers and no cloud at all.

What decides a VM's hourly rate (its record read as machine type, zone, Spot and attached GPUs, and
the machine catalog's rule for the GPUs a type comes with) is not here: it lives in
``plugins/module_utils/forja_cost.py`` with the price table, which the ``forja_hourly_rate`` filter
imports the Ansible way (an installed collection needs no forja). ``Instance.from_mapping`` reads
those fields through it and ``machine_rate`` is its rule, re-exported, so a playbook and ``forja
cost`` price a VM alike; this module adds what only forja's reports need: running intervals, the
one-minute minimum, disks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from forja.cost.prices import RULES as _rules  # plugins/module_utils/forja_cost.py
from forja.cost.prices import PriceError, PriceTable, Rate, region_of

MIN_BILLED_S = 60.0
RUNNING_STATES = frozenset({"RUNNING", "STOPPING", "SUSPENDING"})
DEFAULT_DISK_TYPE: str = _rules.DEFAULT_DISK_TYPE
#: The VM's hourly rate under its machine type's price key, GPUs a type comes with not added again
#: (the catalog says which): the filter's rule, from module_utils/forja_cost.py.
machine_rate = _rules.machine_rate


@dataclasses.dataclass(frozen=True)
class Interval:
    """One stretch of running: from a start to a stop (None while it still runs)."""

    start: datetime
    end: datetime | None = None

    def seconds(self, now: datetime) -> float:
        end = self.end or now
        return max(0.0, (end - self.start).total_seconds())


def parse_time(value: str | datetime) -> datetime:
    """RFC 3339 as the Compute API writes it ("2026-11-22T04:05:32.123-08:00"); naive means UTC."""
    if isinstance(value, datetime):
        stamp = value
    else:
        text = str(value).strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            stamp = datetime.fromisoformat(text)
        except ValueError as exc:
            raise ValueError(f"timestamp {value!r} is not RFC 3339 like '2026-11-22T04:05:32-08:00'") from exc
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)


def billed_seconds(intervals: Iterable[Interval], now: datetime) -> float:
    """Seconds billed: each start costs at least a minute, then per second."""
    return sum(max(MIN_BILLED_S, iv.seconds(now)) for iv in intervals)


def compute_spend(usd_per_hour: float, intervals: Iterable[Interval], now: datetime) -> float:
    """USD for the VM itself over these running intervals (disks are separate)."""
    return usd_per_hour * billed_seconds(intervals, now) / 3600.0


def disk_spend(
    usd_per_gb_month: float, size_gb: float, seconds: float, hours_per_month: float = 730
) -> float:
    """USD for a disk over a span of time; it accrues whether the VM runs or not."""
    return usd_per_gb_month * size_gb * (seconds / 3600.0) / hours_per_month


@dataclasses.dataclass(frozen=True)
class Disk:
    type: str
    size_gb: float


@dataclasses.dataclass(frozen=True)
class Instance:
    """What the cost report needs to know about one VM, whatever shape it came in."""

    name: str
    zone: str
    machine_type: str
    status: str
    spot: bool = False
    last_start: datetime | None = None
    last_stop: datetime | None = None
    created: datetime | None = None
    disks: tuple[Disk, ...] = ()
    accelerators: Mapping[str, int] = dataclasses.field(default_factory=dict)
    history: tuple[Interval, ...] | None = None
    #: STANDARD, SPOT or FLEX_START: Flex-start has its own rate (module_utils/forja_cost.py).
    provisioning_model: str = ""

    @property
    def running(self) -> bool:
        return self.status.upper() in RUNNING_STATES

    def current_interval(self) -> Interval | None:
        """The stretch since the last start, or the last completed one when stopped."""
        if self.last_start is None:
            return None
        if self.running:
            return Interval(self.last_start, None)
        if self.last_stop is not None and self.last_stop >= self.last_start:
            return Interval(self.last_start, self.last_stop)
        return None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Instance:
        """Accept inventory hostvars (snake_case) or the Compute API's JSON (camelCase).

        What decides the rate (name, zone, machine type, Spot, attached GPUs) is read as the
        forja_hourly_rate filter reads it (module_utils/forja_cost.py ``PricedVm``); the rest here."""
        priced = _rules.PricedVm.from_mapping(data)
        short = _rules.short

        def pick(*keys: str) -> Any:
            for key in keys:
                if data.get(key) not in (None, ""):
                    return data[key]
            return None

        def stamp(*keys: str) -> datetime | None:
            value = pick(*keys)
            return parse_time(value) if value else None

        disks: list[Disk] = []
        for size_key, type_key in (("disk_size_gb", "disk_type"), ("boot_disk_size_gb", "boot_disk_type")):
            if pick(size_key) is not None:
                disks.append(Disk(short(pick(type_key)) or DEFAULT_DISK_TYPE, float(pick(size_key))))
        for disk in data.get("disks") or []:
            size = disk.get("diskSizeGb") or disk.get("disk_size_gb") or disk.get("size_gb")
            if size is None:
                continue
            params = disk.get("initializeParams") or {}
            dtype = short(disk.get("disk_type") or disk.get("diskType") or params.get("diskType"))
            disks.append(Disk(dtype or DEFAULT_DISK_TYPE, float(size)))

        history = None
        if data.get("intervals") is not None:
            history = tuple(
                Interval(parse_time(iv["start"]), parse_time(iv["end"]) if iv.get("end") else None)
                for iv in data["intervals"]
            )
        return cls(
            name=priced.name,
            zone=priced.zone,
            machine_type=priced.machine_type,
            status=str(pick("status") or "UNKNOWN"),
            spot=priced.spot,
            provisioning_model=priced.provisioning_model,
            last_start=stamp("last_start_timestamp", "lastStartTimestamp"),
            last_stop=stamp("last_stop_timestamp", "lastStopTimestamp"),
            created=stamp("creation_timestamp", "creationTimestamp"),
            disks=tuple(disks),
            accelerators=dict(priced.accelerators),
            history=history,
        )


@dataclasses.dataclass(frozen=True)
class CostLine:
    """One row of `forja cost`: every figure a user needs to decide whether to stop a VM."""

    name: str
    zone: str
    machine_type: str
    spot: bool
    status: str
    usd_per_hour: float
    basis: str
    uptime_s: float
    session_usd: float
    total_usd: float | None
    monthly_if_running_usd: float
    disk_usd_per_month: float | None
    disk_usd_so_far: float | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rate_of(machine_type: str, zone: str, prices: PriceTable, spot: bool = False) -> Rate:
    """The hourly rate of one machine type in one zone, by the same rules as a whole instance's."""
    return machine_rate(Instance.from_mapping({"name": machine_type, "machine_type": machine_type,
                                               "zone": zone, "preemptible": spot}), prices)


def disk_month_usd(instances: Iterable[Instance], prices: PriceTable) -> float:
    """USD a month for the instances' disks (billed per GB-month, running or not)."""
    return sum(prices.disk_price(d.type, region_of(vm.zone)).usd_per_gb_month * d.size_gb
               for vm in instances for d in vm.disks)


#: Compute Engine's states of a VM that bills no compute but keeps its disks (and bills them).
STOPPED_STATES = frozenset({"TERMINATED", "SUSPENDED"})


def stopped_disks(lines: Iterable[CostLine]) -> tuple[list[str], float]:
    """The stopped VMs whose disks are priced, and what those disks cost a month: the bill people forget
    (autostop_delete_after and `forja prune` delete such a VM once its checkpoints are in the bucket)."""
    stopped = [line for line in lines if line.status.upper() in STOPPED_STATES and line.disk_usd_per_month]
    return [line.name for line in stopped], round(sum(line.disk_usd_per_month or 0.0 for line in stopped), 4)


def cost_of(instance: Instance, prices: PriceTable, now: datetime) -> CostLine:
    """Rate, uptime since the last start, spend, the 'left running' month and the disk's cost."""
    rate = machine_rate(instance, prices)
    disk_month = disk_month_usd([instance], prices)
    disks_known = bool(instance.disks)
    current = instance.current_interval()
    uptime = current.seconds(now) if current is not None and instance.running else 0.0
    session = compute_spend(rate.usd_per_hour, [current], now) if current is not None else 0.0
    total = compute_spend(rate.usd_per_hour, instance.history, now) if instance.history is not None else None
    disk_so_far = None
    if instance.created is not None and disks_known:
        lifetime = max(0.0, (now - instance.created).total_seconds())
        disk_so_far = disk_month * (lifetime / 3600.0) / prices.hours_per_month
    return CostLine(
        name=instance.name,
        zone=instance.zone,
        machine_type=instance.machine_type,
        spot=instance.spot,
        status=instance.status,
        usd_per_hour=rate.usd_per_hour,
        basis=rate.basis,
        uptime_s=uptime,
        session_usd=round(session, 6),
        total_usd=None if total is None else round(total, 6),
        monthly_if_running_usd=round(rate.usd_per_hour * prices.hours_per_month + disk_month, 4),
        disk_usd_per_month=round(disk_month, 4) if disks_known else None,
        disk_usd_so_far=None if disk_so_far is None else round(disk_so_far, 6),
    )


def cost_report(instances: Sequence[Mapping[str, Any]], prices: PriceTable, now: datetime) -> list[CostLine]:
    """Cost lines for a list of instance dicts; a bad entry's error names the instance."""
    lines = []
    for raw in instances:
        try:
            lines.append(cost_of(Instance.from_mapping(raw), prices, now))
        except (PriceError, ValueError) as exc:
            raise type(exc)(f"{raw.get('name', '<unnamed>')}: {exc}") from exc
    return lines
