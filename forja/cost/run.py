"""A run's cost: the one figure every view shows as "cost", and the parts it splits into.

The definition (docs/cost-definition.md says it for users): a run's **cost** is what its VMs bill for
it, from the run's start (forja records it before the playbook, or the host set it up) to its end:
- each VM of the run (one, or every member of its cluster: a run keeps them all up) at its hourly rate
  from forja's price table (machine type with its GPUs, Spot or on-demand, Flex-start), over the time
  it was up for the run: the span minus the outages the watcher counted after a preemption;
- plus their persistent disks over the whole span (they bill even while a preempted VM is down);
- a Vertex AI run: its machines' rate (vertex.note_rate: Compute Engine's on-demand price, a floor of
  Vertex's own) over its span, no disk.

Why not the trainer's own ``cost_usd``: the trainer prices its processes' wall time, and a run costs
more than that. The VM is paid while forja sends the bundle and installs the environment (setup),
while a preempted VM boots again, and until forja has fetched the results; the disk bills all along.
The trainer's figure is a *part* ("of which training"), never a competing cost.

When each figure is final: while a run goes on, its cost is "cost so far", by this same formula as of
now (`run_cost` with `now`); the trainer's live metric (trainer/live.py) is its own count of it, with
what the VM knows (its wall time at the rate, no setup before it and no disk). Once the run has ended,
`forja.cost_report.settle` computes this function once, at the run's end, and stores the total as the
history's ``cost_usd`` with the rate it used (a ``priced`` history event, recorded as `forja train` sent
the run when the train playbook published its VMs' records, else then): every view then shows that
figure, and a later `forja cost --run` recomputes it from the same record, whatever the inventory
says by then (a VM resized or deleted since does not reprice an old run).

The split comes from what the run wrote (its fetched ``events.jsonl`` and ``metrics.jsonl``):
- setup: forja recorded the run (before the playbook) until the trainer's first ``start`` event;
- recovery: each restart or zone move the history records until the trainer's next ``resume``;
- data wait: each metrics line's per-step ``data_wait_s`` times the steps of its window;
- evaluation: the ``seconds`` of every ``eval``/``finish`` event (older runs: the final
  evaluation's distance from the last checkpoint);
- checkpoints: the ``write_s`` of every ``checkpoint`` event;
- compute: the loop's logged windows minus the three above (what the accelerator was for);
- other: what is left (following, fetching, uploads waited for).
Every figure is derived from real timestamps; a part nobody reported is None, never a guess.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from forja.cost.cluster import fleet_rate
from forja.cost.prices import PriceTable
from forja.cost.spend import Instance, disk_month_usd, parse_time
from forja.history import BACK_EVENTS, RunEvent, RunRecord
from trainer import run_folder

#: How every view labels the trainer's own count: a part of the cost, never a cost of its own.
TRAINING_LABEL = "of which training (the trainer's own count: its wall time at the rate)"
#: The history event that records the rate a run was priced at (`forja.cost_report.price_run` writes it).
PRICED_EVENT = "priced"
#: The parts of a run's time, in the order people read them.
PARTS = ("setup", "recovery", "compute", "data_wait", "evaluation", "checkpoints", "other")


@dataclasses.dataclass(frozen=True)
class Part:
    """Seconds the VM spent on one part of the run, and what they cost at its rate."""

    name: str
    seconds: float | None
    usd: float | None


@dataclasses.dataclass(frozen=True)
class Pricing:
    """What a run is priced at: its VMs' hourly rate, their disks' hourly rate, and where both came from.

    Kept with the run in its history (a ``priced`` event): when forja sends the run, from the VM
    records the train playbook published, else once it has ended (forja.cost_report.price_run, the one
    place it is decided), so the figure every view shows is recomputed from that record alone."""

    usd_per_hour: float
    source: str
    #: USD an hour for the disks (None: no record of the run's VM, so the disk is not counted).
    disk_usd_per_hour: float | None = None
    #: How many VMs the rate counts (None: the rate the run itself used, no VM record).
    vm_count: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def recorded(cls, history: Sequence[RunEvent], since: str | None = None) -> Pricing | None:
        """The newest pricing recorded with the run, or None when it has none (or an unreadable one).

        `since` (the run's start) leaves out what an earlier run under the same name recorded: the
        history keeps its events when a new run takes the name (History.start)."""
        after = _stamp(since)
        for event in reversed(history):
            if after is not None and (_stamp(event.time) or 0.0) < after:
                continue
            if event.kind == PRICED_EVENT:
                rate, disk = event.data.get("usd_per_hour"), event.data.get("disk_usd_per_hour")
                if not isinstance(rate, int | float) or not isinstance(disk, int | float | None):
                    return None
                count = event.data.get("vm_count")
                return cls(float(rate), str(event.data.get("source") or "recorded with the run"),
                           None if disk is None else float(disk), count if isinstance(count, int) else None)
        return None

    @classmethod
    def of(cls, files: RunFiles, prices: PriceTable, instances: Sequence[Mapping[str, Any]] = ()) -> Pricing:
        """The rate of `instances` (one VM, or every member of the run's cluster), else the rate the
        run itself used (its config's price_per_hour, which trainer_run looked up in the same table,
        times the cluster's node count; vertex.note_rate's for a Vertex job), with no disk. With
        neither, ValueError says what to give."""
        vms = [Instance.from_mapping(i) for i in instances]
        if vms:
            rate = fleet_rate(vms, prices)
            disk = None
            if any(vm.disks for vm in vms):
                disk = disk_month_usd(vms, prices) / prices.hours_per_month
            return cls(rate.usd_per_hour, f"{rate.what}, prices of {prices.date}", disk, len(vms))
        used = files.config.get("price_per_hour")
        if isinstance(used, int | float) and not isinstance(used, bool) and used > 0:
            return cls(float(used), "the run's price_per_hour (config.yaml)")
        raise ValueError("no hourly rate known (no record of the run's VM, no fetched config.yaml with "
                         "price_per_hour); give the inventory (-i) or --instances with the run's VM")


@dataclasses.dataclass(frozen=True)
class RunCost:
    """One run's cost: the VM while it ran for the run, the disk over the whole span, and the split."""

    run_id: str
    status: str
    started_at: str
    ended_at: str | None
    #: Where the hourly rate came from: the instance's price in forja's table, or the rate the run used.
    usd_per_hour: float
    rate_source: str
    span_s: float
    down_s: float
    up_s: float
    vm_usd: float
    disk_usd: float | None
    #: The run's cost: the figure every view shows as "cost" (vm_usd + disk_usd).
    cost_usd: float
    preemptions: int
    zone_moves: int
    #: Of which training: the trainer's own count (its processes' wall time at the rate), a part of
    #: cost_usd that leaves out the setup before it started, the fetch after it and the disk.
    training_usd: float | None
    parts: tuple[Part, ...]
    #: How many VMs the rate and the disk count (a run on a cluster keeps every member up); None when
    #: the rate is the run's own price_per_hour.
    vm_count: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """What a fetched run folder holds: its trainer events, metrics lines, summary and config."""

    events: list[dict[str, Any]]
    metrics: list[dict[str, Any]]
    summary: dict[str, Any]
    config: dict[str, Any]

    @classmethod
    def read(cls, folder: str | Path | None) -> RunFiles:
        """The files of `folder` (the history's artifact_dir); an absent folder or file reads as empty."""
        root = Path(folder) if folder else None

        def lines(name: str) -> list[dict[str, Any]]:
            path = root / name if root is not None else None
            if path is None or not path.is_file():
                return []
            found = []
            for line in path.read_text().splitlines():  # a line cut by a crash: skipped
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict):
                    found.append(obj)
            return found

        def mapping(name: str, load: Any) -> dict[str, Any]:
            path = root / name if root is not None else None
            if path is None or not path.is_file():
                return {}
            try:
                data = load(path.read_text())
            except (ValueError, yaml.YAMLError):
                return {}
            return data if isinstance(data, dict) else {}

        return cls(lines(run_folder.EVENTS), lines(run_folder.METRICS),
                   mapping(run_folder.SUMMARY, json.loads), mapping(run_folder.CONFIG, yaml.safe_load))


def _stamp(value: str | None) -> float | None:
    return parse_time(value).timestamp() if value else None


def windows(metrics: Sequence[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """(loop seconds, data-wait seconds) over the logged windows: each line covers the steps since the
    line before (metrics of redone steps were dropped by the trainer on resume)."""
    if not metrics:
        return None, None
    loop = wait = 0.0
    previous = 0
    for line in metrics:
        step = int(line.get("step") or 0)
        steps = max(0, step - previous)
        previous = step
        loop += float(line.get("step_time_s") or 0.0) * steps
        wait += float(line.get("data_wait_s") or 0.0) * steps
    return loop, wait


def _evaluation(
    events: Sequence[Mapping[str, Any]], metrics: Sequence[Mapping[str, Any]]
) -> tuple[float, float]:
    """(seconds of every evaluation, of those inside the loop's windows); an older run's event without
    `seconds` is timed from the event before it (the final checkpoint, or the metrics line of its step)."""
    logged = {int(m.get("step") or -1): float(m.get("time") or 0.0) for m in metrics}
    total = inside = 0.0
    before: Mapping[str, Any] | None = None
    for event in events:
        kind = event.get("event")
        if kind == "eval" or (kind == "finish" and "eval_loss" in event):
            seconds = event.get("seconds")
            if seconds is None:
                start = logged.get(int(event.get("step") or -1)) if kind == "eval" else None
                if start is None and before is not None:
                    start = float(before.get("time") or 0.0)
                seconds = max(0.0, float(event.get("time") or 0.0) - start) if start else 0.0
            total += float(seconds)
            if kind == "eval":
                inside += float(seconds)
        before = event
    return total, inside


def _setup_and_recovery(
    record: RunRecord, history: Sequence[RunEvent], events: Sequence[Mapping[str, Any]]
) -> tuple[float | None, float | None]:
    """Setup: recorded start to the trainer's first start. Recovery: each time the VM came back
    (history) to the trainer's next resume."""
    began = _stamp(record.started_at)
    sessions = [e for e in events if e.get("event") in ("start", "resume")]
    if began is None or not sessions:
        return None, None
    setup = max(0.0, float(sessions[0].get("time") or began) - began)
    resumes = [float(e.get("time") or 0.0) for e in sessions[1:]]
    recovery = 0.0
    for back in (_stamp(e.time) for e in history if e.kind in BACK_EVENTS):
        after = [t for t in resumes if back is not None and t >= back]
        if back is not None and after:
            recovery += after[0] - back
    return setup, recovery


def _down_seconds(history: Iterable[RunEvent]) -> float:
    """The outages the watcher counted (its tally is cumulative: the largest figure is the total)."""
    return max((float(e.data.get("seconds_down") or 0.0) for e in history), default=0.0)


def split(
    record: RunRecord, history: Sequence[RunEvent], files: RunFiles, up_s: float
) -> dict[str, float | None]:
    """Seconds of each part (PARTS) of a run that was up `up_s` seconds; None where nothing reported it."""
    setup, recovery = _setup_and_recovery(record, history, files.events)
    loop, wait = windows(files.metrics)
    evaluation, eval_in_loop = _evaluation(files.events, files.metrics) if files.events else (None, 0.0)
    checkpoints = sum(float(e.get("write_s") or 0.0) for e in files.events if e.get("event") == "checkpoint")
    compute = None if loop is None else max(0.0, loop - (wait or 0.0) - eval_in_loop - checkpoints)
    known = [setup, recovery, compute, wait, evaluation, checkpoints if files.events else None]
    other = max(0.0, up_s - sum(x for x in known if x is not None)) if files.events else None
    return dict(zip(PARTS, [*known, other], strict=True))


def run_cost(
    record: RunRecord,
    history: Sequence[RunEvent],
    files: RunFiles,
    prices: PriceTable,
    now: datetime,
    instances: Sequence[Mapping[str, Any]] = (),
) -> RunCost:
    """The cost of `record` as of `now` (its end once it has one): the one figure every view shows.

    The VMs at their rate while up for the run, their disks all along (the module's docstring says
    why). The rate is the one recorded with the run since its start (a ``priced`` event: when it was
    sent, or settled), else
    `instances`' (forja's price table; as the inventory or --instances gives them: one VM, or every
    member of the run's cluster, "2 × g2-standard-24"), else the rate the run itself used (its
    config's price_per_hour), with no disk; with none, ValueError says what to give.
    """
    try:
        pricing = Pricing.recorded(history, record.started_at) or Pricing.of(files, prices, instances)
    except ValueError as exc:
        raise ValueError(f"run {record.run_id}: {exc}") from exc
    return priced(record, history, files, pricing, now)


def priced(
    record: RunRecord, history: Sequence[RunEvent], files: RunFiles, pricing: Pricing, now: datetime
) -> RunCost:
    """The cost of `record` at `pricing` as of `now`: `run_cost` once the rate is decided."""
    began = _stamp(record.started_at) or now.timestamp()
    ended = _stamp(record.ended_at) or now.timestamp()
    span = max(0.0, ended - began)
    down = min(span, _down_seconds(history))
    up = span - down
    per_s = pricing.usd_per_hour / 3600.0
    disk_usd = None if pricing.disk_usd_per_hour is None else pricing.disk_usd_per_hour * span / 3600.0
    seconds = split(record, history, files, up)
    parts = tuple(Part(name, s, None if s is None else s * per_s) for name, s in seconds.items())
    training = files.summary.get("cost_usd")
    return RunCost(
        run_id=record.run_id,
        status=record.status,
        started_at=record.started_at,
        ended_at=record.ended_at,
        usd_per_hour=pricing.usd_per_hour,
        rate_source=pricing.source,
        span_s=span,
        down_s=down,
        up_s=up,
        vm_usd=up * per_s,
        disk_usd=disk_usd,
        cost_usd=up * per_s + (disk_usd or 0.0),
        preemptions=max(record.preemptions, sum(1 for e in history if e.kind == "preempted")),
        zone_moves=sum(1 for e in history if e.kind == "zone_moved"),
        training_usd=float(training) if isinstance(training, int | float) else None,
        parts=parts,
        vm_count=pricing.vm_count,
    )
