"""What the hosts cost: their hourly rates and spend, one run's cost part by part, and a run's cost
before it is sent.

Why apart from `forja.cost`: that package computes (prices, spend, budgets, a run's parts) from
records it is given and knows no inventory or history; this module gives it the session's
inventory records and history, and turns its errors into the field the user should fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forja import defaults, errors, inventory
from forja.session import Session

#: The fraction of a cap at which `cost` warns, unless told otherwise; what a cap applies to: each
#: instance (the default) or the whole project.
WARN_AT, SCOPES = defaults.WARN_AT, defaults.SCOPES


@dataclass(frozen=True)
class CostReport:
    """What `Forja.cost` found: one line per priced instance, its budget check, the hosts not priced,
    and one line per cluster (forja.cost.cluster: its members added up, "2 × g2-standard-24")."""

    prices_date: str
    now: datetime
    lines: list[Any]
    #: One per line (None without a per-instance cap; a cluster's members share their cluster's
    #: check); `project` is the check of a project cap.
    checks: list[Any]
    project: Any | None
    skipped: list[str]
    clusters: list[Any] = field(default_factory=list)
    #: The user's own machines in the inventory (host_contract_platform: own): no cloud price.
    own_machines: list[str] = field(default_factory=list)

    @property
    def stopped_disks(self) -> tuple[list[str], float]:
        """The stopped VMs and what their disks still cost a month (forja.cost.spend.stopped_disks)."""
        from forja.cost.spend import stopped_disks

        return stopped_disks(self.lines)

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of `forja --json cost`: every figure at full precision."""
        stopped, stopped_month = self.stopped_disks
        out: dict[str, Any] = {
            "prices_date": self.prices_date,
            "now": self.now.isoformat(),
            "instances": [
                {**line.as_dict(),
                 "budget": None if chk is None else {"level": chk.level.value, "message": chk.message}}
                for line, chk in zip(self.lines, self.checks, strict=True)
            ],
            "skipped": self.skipped,
            "clusters": [c.as_dict() for c in self.clusters],
            "own_machines": self.own_machines,
            "stopped_disks": {"instances": stopped, "usd_per_month": stopped_month},
        }
        if self.project is not None:
            out["project_budget"] = {"level": self.project.level.value, "message": self.project.message}
        return out


def cost(
    session: Session,
    instances: Sequence[Mapping[str, Any]] | None = None,
    *,
    prices: str | Path | None = None,
    cap: float | None = None,
    warn: float = WARN_AT,
    scope: str = SCOPES[0],
    now: str | datetime | None = None,
) -> CostReport:
    """Each instance's hourly rate, uptime, spend, monthly figure if left running, and disk cost.

    Instances are the inventory's GCP hosts (their records), or `instances` (dicts shaped like
    those records: offline reports, tests). `prices` is a YAML merged over the built-in table;
    `cap` checks spend against a cap in USD per 'instance' or for the 'project' (`scope`),
    warning at the `warn` fraction of it; `now` computes as of an RFC 3339 time.
    """
    from forja.cost.budget import Budget, check_project, check_units
    from forja.cost.cluster import cluster_lines, unit_lines
    from forja.cost.prices import PriceError, load_prices
    from forja.cost.spend import cost_report, parse_time

    if scope not in ("instance", "project"):
        raise errors.ConfigError("scope", f"{scope!r}: use 'instance' or 'project'")
    try:
        table = load_prices(Path(prices) if prices else None)
        budget = Budget(cap, warn) if cap is not None else None
    except (PriceError, ValueError) as exc:
        raise errors.ConfigError("prices/cap/warn", str(exc)) from exc
    moment = parse_time(now) if now else datetime.now(timezone.utc)
    skipped: list[str] = []
    own: list[str] = []
    if instances is None:
        raw, own, skipped = inventory.gcp_instances(inventory.required(session.inventory))
    else:
        raw = [dict(i) for i in instances]
    try:
        lines = cost_report(raw, table, moment)
    except (PriceError, ValueError) as exc:
        raise errors.ConfigError("instances/prices", str(exc)) from exc
    checks: list[Any] = [None] * len(lines)
    project = None
    if budget is not None and scope == "instance":  # a cluster's members: one check of them all
        # cost_report keeps the records' order, so unit_lines pairs each record with its line
        found = check_units(budget, [unit for _, unit in unit_lines(raw, lines)])
        checks = [found[line.name] for line in lines]
    elif budget is not None:
        project = check_project(budget, lines)
    return CostReport(table.date, moment, lines, checks, project, skipped, cluster_lines(raw, lines), own)

def rate(
    session: Session, machine_type: str, zone: str, *, spot: bool = False, prices: str | Path | None = None
) -> Any:
    """The hourly rate of one machine type in one zone (on demand, or Spot), with its basis."""
    from forja.cost.prices import PriceError, load_prices
    from forja.cost.spend import rate_of

    try:
        return rate_of(machine_type, zone, load_prices(Path(prices) if prices else None), spot)
    except (PriceError, ValueError) as exc:
        raise errors.ConfigError("machine_type/zone/prices", str(exc)) from exc

def run_cost(
    session: Session,
    run_id: str,
    instances: Sequence[Mapping[str, Any]] | None = None,
    *,
    prices: str | Path | None = None,
    now: str | datetime | None = None,
) -> Any:
    """One run's cost from its history and fetched results: setup, recovery, compute, data wait,
    evaluation, checkpoints and the rest, the VM's time down, the disk (see forja/cost/run.py).

    A run that has ended is priced as it was when it ended (the rate `settle` recorded with it).
    Otherwise the VMs' rate and disks are their instances' (`instances`, else the inventory when one
    is named): the run's hosts and every other member of their cluster ("2 × g2-standard-24");
    without one, the rate the run itself used (its config's price_per_hour) and no disk.
    """
    from forja.cost.prices import PriceError, load_prices
    from forja.cost.run import run_cost as cost_of_run
    from forja.cost.spend import parse_time

    record = session.history.find(run_id)
    moment = parse_time(now) if now else datetime.now(timezone.utc)
    try:
        table = load_prices(Path(prices) if prices else None)
        return cost_of_run(record, session.history.events(record.run_id), _files(session, record),
                           table, moment, _run_instances(session, record, instances))
    except (PriceError, ValueError) as exc:
        raise errors.ConfigError("run/instances/prices", str(exc)) from exc


def settle(
    session: Session, run_id: str, instances: Sequence[Mapping[str, Any]] | None = None
) -> Any | None:
    """Price a run that has ended, once, and store its cost in the history: the figure every view shows.

    Called where forja learns that a run ended: where its results are fetched (`forja fetch`, and
    following a run to its end, which fetches it), else where its end is seen without a fetch (`forja
    status`, `forja stop`, a sweep's look, the train playbook's record of a site.yml run, a Vertex
    job's end). A run is settled once per end: a ``settled`` history event records the figure and the
    end it was settled at, and a later call for that end (a look after the fetch, a second fetch)
    changes nothing. Once a rate is recorded the figure depends on the run's span and outages, never on
    its fetched files, so a second settle could only write the same figure again.

    A run `forja train` sent was priced as it was sent (`price_run` from the VM records the play
    published), so this reads no inventory; otherwise the first call records the rate (`price_run`: the
    run's VMs from `instances` or the inventory, else the run's own price_per_hour, or 0 on the user's
    own machine); the run's config is its fetched one, else the one it was sent with (`_files`), so a
    fetch that failed still leaves a cost. Returns the RunCost it settled now; None for a run still
    going on, one with no rate known (its fetch may price it later, from its config), or one already
    settled at this end, however that end is written since (the history holds its figure:
    `settled_cost`)."""
    from forja.cost.run import Pricing, priced

    record = session.history.get(run_id)
    if not record.ended_at:
        return None
    history = session.history.events(run_id)
    if _settled_at_end(history, record) is not None:
        return None
    files = _files(session, record)
    pricing = Pricing.recorded(history, record.started_at)
    if pricing is None:
        own: list[str] = []
        # The inventory is read once per run: a run its hosts cannot price (no machine type, not the
        # user's own machine) is marked, and later looks try only its fetched config's price_per_hour.
        looked = bool(_since(history, UNPRICED_EVENT, record.started_at))
        if instances is None and session.inventory and not looked:
            with contextlib.suppress(errors.ForjaError):
                instances, own, _ = inventory.gcp_instances(inventory.required(session.inventory))
        pricing = price_run(session, record, instances or [], files=files, own=own)
        if pricing is None:
            if not looked:
                session.history.record_event(run_id, UNPRICED_EVENT,
                                             reason="no hourly rate known for the run's hosts")
            return None
        history = session.history.events(run_id)
    found = priced(record, history, files, pricing, datetime.now(timezone.utc))
    session.history.update(run_id, cost_usd=found.cost_usd)
    session.history.record_event(run_id, SETTLED_EVENT, cost_usd=found.cost_usd, ended_at=record.ended_at)
    return found


def settled_cost(history: Any, run_id: str) -> float | None:
    """The run's cost as `settle` stored it at the run's end; None while it is not settled (the run goes
    on, ended with no rate known, or is not in `history`).

    Why not the history's ``cost_usd`` alone: while a followed run trains, that column holds the
    trainer's live count ("cost so far"); only a ``settled`` event of the run's current end says the
    figure is the run's cost."""
    try:
        record = history.get(run_id)
    except errors.RunNotFound:
        return None
    event = _settled_at_end(history.events(run_id), record) if record.ended_at else None
    value = event.data.get("cost_usd") if event is not None else None
    return float(value) if isinstance(value, int | float) else None


#: A history event: the inventory was read to price the run and gave no rate (read once per run).
UNPRICED_EVENT = "unpriced"
#: A history event: the run's cost settled at its end (its `cost_usd`, and the `ended_at` it is for).
SETTLED_EVENT = "settled"


#: Two ends of a run closer than this are one end written in two forms: the history writes times to
#: the second (forja.history.now), and a host or another writer may give the same instant with another
#: precision, offset or "Z". Two real ends of a run (a preemption, then its end) are minutes apart.
SAME_END_S = 1.0


def _since(history: Sequence[Any], kind: str, started_at: str | None) -> list[Any]:
    """The run's events of `kind` since it started, not an earlier run's under its name (History.start
    keeps those when a new run takes the name)."""
    from forja.cost.spend import parse_time

    start = parse_time(started_at) if started_at else None
    return [e for e in history if e.kind == kind and (start is None or parse_time(e.time) >= start)]


def _settled_at_end(history: Sequence[Any], record: Any) -> Any | None:
    """The ``settled`` event of the run's current end, when it was settled at it: the same instant,
    however the end was written since (`_same_end`). A later end (the run went on after a preemption)
    is a new end, settled again there."""
    return next((e for e in reversed(_since(history, SETTLED_EVENT, record.started_at))
                 if _same_end(e.data.get("ended_at"), record.ended_at)), None)


def _same_end(settled_at: Any, ended_at: str) -> bool:
    """Whether a ``settled`` event's end is the record's end: compared as instants, not as text."""
    from forja.cost.spend import parse_time

    if settled_at == ended_at:
        return True
    if not isinstance(settled_at, str):
        return False
    try:
        return abs((parse_time(settled_at) - parse_time(ended_at)).total_seconds()) < SAME_END_S
    except ValueError:
        return False


def price_run(
    session: Session, record: Any, instances: Sequence[Mapping[str, Any]], *, files: Any = None,
    own: Sequence[str] = (), no_vm: str | None = None,
) -> Any | None:
    """The rate `record`'s run is priced at, recorded with it once (a ``priced`` history event): the one
    place it is decided, when forja sends the run (forja.training, from the VM records the train
    playbook published) or, if it was not decided then, when the run ends (`settle`).

    A run already priced since it started keeps that rate. A run a managed watcher sent again on a VM
    it recreated elsewhere keeps its first VM's: forja's table prices a machine type per region (a
    move from us-east1 to europe-west4 would be about 10 % dearer), and a run has one rate, the one
    `forja cost --run` shows. Otherwise: `instances`' rate (the run's VMs and the rest of their
    cluster), else the run's own price_per_hour (`files`' config.yaml; None: not looked at), else 0
    when its hosts are all the user's own machines (`own`), or 0 when no VM was up for it: `no_vm` says
    why (a send that never reached one, forja.training), so it shows 0 and why, never no figure. None,
    and nothing recorded, when no rate is known: an odd record never fails the run's start or end.
    """
    from forja.cost.prices import PriceError, load_prices
    from forja.cost.run import PRICED_EVENT, Pricing, RunFiles

    kept = Pricing.recorded(session.history.events(record.run_id), record.started_at)
    if kept is not None:
        return kept
    if no_vm is not None:
        pricing = Pricing(0.0, no_vm)
    else:
        try:
            pricing = Pricing.of(files or RunFiles.read(None), load_prices(None),
                                 _run_instances(session, record, instances))
        except (PriceError, ValueError, TypeError, KeyError):
            if not (record.hosts and set(record.hosts) <= set(own)):
                return None
            pricing = Pricing(0.0, "the user's own machine: no cloud price")
    session.history.record_event(record.run_id, PRICED_EVENT, **pricing.as_dict())
    return pricing


def _files(session: Session, record: Any) -> Any:
    """The run's fetched files: the folder the history recorded; a run recorded without one (site.yml's,
    found on a host) may still have been fetched to the default place since (`forja fetch RUN`).

    A run whose results did not come back (its fetch failed: the VM was unreachable or gone) keeps the
    config it was sent with, as its snapshot holds it (forja.snapshot): a run on a host with no machine
    type is priced at its config's price_per_hour, and its cost must not hang on a fetch. Its parts
    (setup, compute, ...) wait for its files; its cost does not change when they come."""
    import yaml

    from forja import snapshot
    from forja.cost.run import RunFiles

    files = RunFiles.read(record.artifact_dir or session.read_results(record.run_id)[1])
    if files.config:
        return files
    sent = _since(session.history.events(record.run_id), snapshot.EVENT, record.started_at)
    folder = sent[-1].data.get("folder") if sent else None
    path = Path(str(folder)) / snapshot.CONFIG if folder else None
    try:
        config = yaml.safe_load(path.read_text()) if path is not None and path.is_file() else None
    except (OSError, yaml.YAMLError):
        config = None
    return replace(files, config=config) if isinstance(config, dict) and config else files


def _run_instances(
    session: Session, record: Any, instances: Sequence[Mapping[str, Any]] | None
) -> list[Mapping[str, Any]]:
    """The instance records of the run's VMs: its hosts and the rest of their cluster, from `instances`
    or the inventory when one is named; with one VM (or one cluster) and no hosts recorded, that one."""
    from forja.cost.cluster import groups, with_members

    found = [dict(i) for i in instances] if instances is not None else session.instances_if_named()
    mine = with_members(found, record.hosts)
    units = groups(found)
    if not mine and len(units) == 1 and not record.hosts:  # one VM (or one cluster): the run's
        mine = units[0][1]
    return mine


def estimate(
    session: Session,
    config: str | Path,
    instances: Sequence[Mapping[str, Any]] | None = None,
    *,
    prices: str | Path | None = None,
) -> Any:
    """What sending `config` will cost: steps x seconds per step measured by the newest earlier run
    of that config (or of the same model, batch and precision), plus its setup and evaluation, at
    the VMs' hourly rate, plus their disks. `forja train` shows it before sending.

    The VMs are `instances` or the inventory's (their records), every member of a cluster counted
    ("2 × g2-standard-24"); with no earlier run the time is the one `forja plan` predicts on that
    machine type, labelled predicted (the run it precedes measures it).
    """
    from forja.cost.cluster import fleet_rate
    from forja.cost.estimate import estimate
    from forja.cost.prices import PriceError, load_prices
    from forja.cost.spend import Instance, disk_month_usd

    path = Path(config).expanduser()
    if not path.is_file():
        raise errors.ConfigError("config", f"{config} is not a file; give a trainer config YAML")
    found = [dict(i) for i in instances] if instances is not None else (
        inventory.gcp_instances(inventory.required(session.inventory))[0])
    chosen = session.chosen_cluster() if instances is None else None
    if chosen is not None:  # the run keeps its cluster up, not the inventory's other VMs
        found = [i for i in found if i.get("name") in chosen.members]
    if not found:
        raise errors.ConfigError("inventory", "no host with a machine_type and zone to price")
    try:
        table = load_prices(Path(prices) if prices else None)
        vms = [Instance.from_mapping(i) for i in found]
        rate = fleet_rate(vms, table)
        disk = disk_month_usd(vms, table)
    except (PriceError, ValueError) as exc:
        raise errors.ConfigError("instances/prices", str(exc)) from exc
    kinds = {vm.machine_type for vm in vms}
    predict = None
    if len(kinds) == 1:  # forja plan's prediction on that machine: the time when no run measured it
        from forja.plan import prediction

        machine = next(iter(kinds))
        predict = lambda make: prediction(session, path, machine, make=make)  # noqa: E731
    return estimate(path, session.history, rate.usd_per_hour, rate.what,
                    disk if any(vm.disks for vm in vms) else None, table.hours_per_month, predict)
