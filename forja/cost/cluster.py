"""A cluster in the bill: its N VMs cost N x a member's rate, and the user is told "2 x g2-standard-24".

Why here, once: the gcp_instance role makes `gcp_instance_count` VMs of one cluster, and the gcp_gpu
inventory marks each with `forja_cluster` and `forja_node_rank` (plugins/inventory/gcp_gpu.py). A run
on a cluster keeps every member up, so each place that prices "the VM" of a run (its cost, the
estimate before sending, the budget check, `forja cost`) must count them all, and say how many it
counted: a figure that silently priced one VM of four reads as a quarter of the truth.

Inputs are instance records shaped like the inventory's (hostvars, or `--instances` files); a record
without `forja_cluster` is a VM of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from forja.cost.prices import PriceTable, Rate
from forja.cost.spend import CostLine, Instance, machine_rate

#: The hostvars the gcp_gpu inventory plugin sets on a cluster's members (its documented contract).
CLUSTER_VAR = "forja_cluster"
RANK_VAR = "forja_node_rank"
#: How a count of equal things is written for people: "2 × g2-standard-24".
TIMES = " × "


def cluster_of(record: Mapping[str, Any]) -> str | None:
    """The cluster a VM belongs to, or None for a VM of its own."""
    value = record.get(CLUSTER_VAR)
    return str(value) if value not in (None, "") else None


def rank_of(record: Mapping[str, Any]) -> int:
    value = record.get(RANK_VAR)
    return int(value) if isinstance(value, int) or (isinstance(value, str) and value.isdigit()) else 0


def groups(records: Sequence[Mapping[str, Any]]) -> list[tuple[str | None, list[Mapping[str, Any]]]]:
    """The records as the units they are paid for: each cluster's members in rank order, each other
    VM alone (cluster None); in the order the first of each unit appears."""
    found: dict[str, list[Mapping[str, Any]]] = {}
    units: list[tuple[str | None, list[Mapping[str, Any]]]] = []
    for record in records:
        name = cluster_of(record)
        if name is None:
            units.append((None, [record]))
        elif name in found:
            found[name].append(record)
        else:
            found[name] = [record]
            units.append((name, found[name]))
    for _, members in units:
        members.sort(key=rank_of)
    return units


def with_members(records: Sequence[Mapping[str, Any]], names: Iterable[str]) -> list[Mapping[str, Any]]:
    """The records named (a run's hosts), plus every other member of their clusters: a run recorded on
    its rank-0 host alone still kept the whole cluster up."""
    wanted = set(names)
    clusters = {cluster_of(r) for r in records if r.get("name") in wanted} - {None}
    return [r for r in records if r.get("name") in wanted or cluster_of(r) in clusters]


def counted(labels: Iterable[str]) -> str:
    """Equal labels counted, in order: ["a", "a", "b"] -> "2 × a + b"."""
    tally: dict[str, int] = {}
    for label in labels:
        tally[label] = tally.get(label, 0) + 1
    return " + ".join(label if n == 1 else f"{n}{TIMES}{label}" for label, n in tally.items())


def fleet_rate(vms: Sequence[Instance], prices: PriceTable) -> Rate:
    """The hourly rate of VMs kept up together (a cluster, or what a run's hosts are): the sum of their
    rates, described with the count ("2 × g2-standard-24 on_demand in us-east1")."""
    rates = [machine_rate(vm, prices) for vm in vms]
    basis = "estimate" if any("estimate" in r.basis for r in rates) else (rates[0].basis if rates else "")
    return Rate(round(sum(r.usd_per_hour for r in rates), 6), basis, counted(r.what for r in rates))


@dataclasses.dataclass(frozen=True)
class ClusterLine:
    """One cluster of `forja cost`: its members' figures added up, and what it is ("2 × g2-standard-24")."""

    name: str
    members: tuple[str, ...]
    machine: str
    running: int
    usd_per_hour: float
    basis: str
    session_usd: float
    total_usd: float | None
    monthly_if_running_usd: float
    disk_usd_per_month: float | None

    @property
    def count(self) -> int:
        return len(self.members)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "count": self.count}


def unit_lines(
    records: Sequence[Mapping[str, Any]], lines: Sequence[CostLine]
) -> list[tuple[str | None, list[CostLine]]]:
    """`groups(records)` with each record's cost line in its place (`lines[i]` is `records[i]`'s)."""
    line_of = {id(r): line for r, line in zip(records, lines, strict=True)}
    return [(name, [line_of[id(r)] for r in members]) for name, members in groups(records)]


def cluster_lines(records: Sequence[Mapping[str, Any]], lines: Sequence[CostLine]) -> list[ClusterLine]:
    """One line per cluster among `records`, from their cost lines (`lines[i]` is `records[i]`'s).

    The rate is every member's rate added (what the cluster costs per hour while up), `running` how
    many of them are up now; the month is every member left running.
    """
    out = []
    for name, mine in unit_lines(records, lines):
        if name is None:
            continue
        totals = [line.total_usd for line in mine]
        disks = [line.disk_usd_per_month for line in mine]
        out.append(ClusterLine(
            name=name,
            members=tuple(line.name for line in mine),
            machine=counted(line.machine_type + (" spot" if line.spot else "") for line in mine),
            running=sum(1 for line in mine if line.status.upper() == "RUNNING"),
            usd_per_hour=round(sum(line.usd_per_hour for line in mine), 6),
            basis="estimate" if any("estimate" in line.basis for line in mine) else mine[0].basis,
            session_usd=round(sum(line.session_usd for line in mine), 6),
            total_usd=None if None in totals else round(sum(t for t in totals if t is not None), 6),
            monthly_if_running_usd=round(sum(line.monthly_if_running_usd for line in mine), 4),
            disk_usd_per_month=None if None in disks else round(sum(d for d in disks if d is not None), 4),
        ))
    return out
