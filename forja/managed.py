"""Managed runs: a watcher on the controller that brings a Spot run back with nobody at the keyboard.

Why on the controller: the VM is what goes away. SkyPilot's managed jobs keep their controller off
the worker for the same reason; forja's is a loop in the user's own process (`forja watch`,
`forja train --managed`), or a user systemd unit running `forja watch`, never a cloud service.

What it does each poll (playbooks/observe.yml reads the VM; changes nothing):
- the run ended (completed, failed, cancelled): stop watching;
- the VM runs: nothing (the run's own unit trains; after a restart it resumes from its checkpoint);
- Google preempted the VM (the zone's `compute.instances.preempted` operation is newer than its
  last start): start it again in its zone;
- the start fails because the zone has no capacity left (ZONE_RESOURCE_POOL_EXHAUSTED), or the VM
  is gone (a Spot VM whose termination action is DELETE): delete what is left and create it in the
  next zone of the list, never the zone that just failed unless nothing else is left; configure it
  with the same playbooks and send the run again, which resumes from the bucket's checkpoint; then
  the VM's run queue as it last mirrored it to the bucket (read before the old VM goes), each run
  queued again in its order with its own options (forja.queue.restore);
- a Flex-start VM reached its max run duration (the run saved and mirrored its checkpoint a margin
  before, trainer/preemption.py): one Google stopped is started again (it queues for capacity
  anew); one Google deleted is made again, in its zone first;
- the VM was stopped by someone (not preempted): stop watching, saying so;
- a budget is spent (restarts, seconds down, dollars spent while down): stop trying, saying which.

Every transition goes into the run's history (`History.record_event`): preempted, restarted,
zone moved, gave up, with the zone, the seconds down and the money spent while down. Restarted and
zone moved reopen a run whose preemption was recorded as its end (`history.BACK_EVENTS`), so the run
ends, and its cost is settled, where it really ends, less the time down counted here.

Two watchers of one run would fight (both restart, both move): a lock file per run lets only one
watch; a second says which process holds it.

The decisions are one pure function, `decide`, so the whole table is tested without a cloud; the
loop (`Watcher`) only observes, decides and calls forja's verbs (`forja.lifecycle`, `forja.training`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from forja import (
    errors,
    following,
    lifecycle,
    machines,
    module_utils,
    process_lock,
    runstate,
    snapshot,
    training,
)
from forja import format as fmt
from forja import zones as zone_advice
from forja.contract import InstanceState
from forja.defaults import MANAGED_POLL_S, MAX_DOWN, MAX_RECOVERIES
from forja.paths import forja_home
from forja.session import Session


def stockout_codes() -> tuple[str, ...]:
    """Google's error codes for a zone out of capacity: the machine catalog's, which gcp_gpu_instance
    acts on too (read when a watcher needs them: importing forja needs no Ansible content)."""
    return tuple(machines.catalog().STOCKOUT_CODES)


def settling() -> tuple[str, ...]:
    """The statuses of a VM on its way up or down, as the machine catalog names them."""
    return tuple(machines.catalog().SETTLING_STATES)


def run_ended(status: str | None) -> bool:
    """Whether nothing is left to watch: a status the host contract calls final, except "preempted"
    (what a watcher is for), or "cancelled" (forja's word for a run its user called off)."""
    if status is None:
        return False
    return status == "cancelled" or status in runstate.final_statuses() - {"preempted"}


Action = Literal["watch", "restart", "move", "done", "give_up"]


class WatchError(errors.ForjaError):
    """A watcher cannot start, or had to stop trying; the message says why and what to do."""

    exit_code = errors.ExitCode.STOPPED


#: Seconds between two looks at a watched VM: the API's and the CLI's default (with MAX_RECOVERIES and
#: MAX_DOWN, kept in forja/defaults.py, where `forja --help` reads them without loading the API).
POLL_S = MANAGED_POLL_S


@dataclass(frozen=True)
class RecoveryBudget:
    """When the watcher stops trying. Every limit counts for the whole run, across all recoveries.

    Not `forja.cost.Budget` (a spending cap on running VMs): this one bounds a watched run's outages."""

    #: Most recoveries (restarts in place and zone moves together).
    max_recoveries: int = MAX_RECOVERIES
    #: Most seconds the run may spend down, all outages together.
    max_down_s: float = field(default_factory=lambda: seconds(MAX_DOWN, "--max-down"))
    #: Most dollars spent while down (the boot disk bills while the VM is stopped); None: no limit.
    max_down_usd: float | None = None

    def check(self) -> None:
        """Refuse a budget that is spent before it starts, naming the option."""
        if self.max_recoveries < 1:
            raise errors.ConfigError(
                "--max-recoveries", f"{self.max_recoveries} allows no recovery; use 1 or more"
            )
        if self.max_down_s <= 0:
            raise errors.ConfigError("--max-down", "must be more than 0 seconds (e.g. 2h)")
        if self.max_down_usd is not None and self.max_down_usd <= 0:
            raise errors.ConfigError(
                "--max-down-usd", f"{self.max_down_usd} is already used up; use more than 0"
            )


@dataclass(frozen=True)
class Tally:
    """What the watcher has spent so far (kept in its state file, so a restarted watcher goes on)."""

    recoveries: int = 0
    down_s: float = 0.0
    down_usd: float = 0.0
    #: When the current outage began (monotonic seconds are useless across watcher restarts).
    down_since: float | None = None
    #: Zones that ran out of capacity, newest last: tried again only when nothing else is left.
    failed_zones: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    #: For "restart": the zone; for "move": the zones to try, in order.
    zones: tuple[str, ...] = ()


def zone_order(zones: Sequence[str], failed: Sequence[str]) -> tuple[str, ...]:
    """The zones to try, each once: those that have not failed first (in the user's order), then the
    failed ones, the most recent failure last. A zone that just ran out is the last resort."""
    ordered = list(dict.fromkeys(zones))
    recent = [z for z in dict.fromkeys(reversed(failed)) if z in ordered][::-1]  # oldest failure first
    return tuple([z for z in ordered if z not in recent] + recent)


def over_budget(tally: Tally, budget: RecoveryBudget) -> str | None:
    """Which limit is spent, in words; None while all hold."""
    if tally.recoveries >= budget.max_recoveries:
        return (
            f"{tally.recoveries} recoveries made, the most allowed (--max-recoveries {budget.max_recoveries})"
        )
    if tally.down_s >= budget.max_down_s:
        return (f"down {fmt.duration(tally.down_s)} in all, the most allowed "
                f"(--max-down {fmt.duration(budget.max_down_s)})")
    if budget.max_down_usd is not None and tally.down_usd >= budget.max_down_usd:
        return (
            f"${tally.down_usd:.2f} spent while down, the most allowed "
            f"(--max-down-usd {budget.max_down_usd:.2f})"
        )
    return None


def decide(
    vm: InstanceState, run_status: str | None, tally: Tally, budget: RecoveryBudget, zones: Sequence[str]
) -> Decision:
    """What to do about the VM and the run as observed now; the watcher's whole policy."""
    if run_ended(run_status):
        return Decision("done", f"the run {run_status}")
    if vm.running:
        return Decision("watch", "the VM runs")
    if vm.exists and vm.status in settling():
        return Decision("watch", f"the VM is {vm.status}")
    if vm.exists and flex_start_ended(vm):
        spent = over_budget(tally, budget)
        if spent:
            return Decision("give_up", spent)
        return Decision("restart", f"the Flex-start VM reached its max run duration at {vm.ends_at}",
                        (vm.zone,))
    if vm.exists and not vm.preempted_at:
        return Decision(
            "done",
            f"the VM was stopped ({vm.status}) by its user or the autostop guard, "
            "not preempted: a managed run does not undo that",
        )
    spent = over_budget(tally, budget)
    if spent:
        return Decision("give_up", spent)
    if vm.exists:  # preempted, disk kept: start it where it is, unless that zone just ran out
        if vm.zone not in tally.failed_zones[-1:]:
            return Decision("restart", f"Google preempted the VM at {vm.preempted_at}", (vm.zone,))
        return Decision("move", f"{vm.zone} has no capacity", zone_order(zones, tally.failed_zones))
    failed = tally.failed_zones or ((zones[0],) if zones else ())
    return Decision("move", "the VM is gone (a Spot VM deleted on preemption, or a Flex-start VM at the end "
                    "of its run)", zone_order(zones, failed))


def flex_start_ended(vm: InstanceState) -> bool:
    """A Flex-start VM that Google stopped at its max run duration (its termination action STOP):
    stopped, and its last stop no earlier than its end time."""
    if vm.provisioning_model != "FLEX_START" or vm.running or not vm.ends_at or not vm.last_stop:
        return False
    from forja.cost.spend import parse_time

    return parse_time(vm.last_stop) >= parse_time(vm.ends_at)


@dataclass
class WatchState:
    """What `forja watch` keeps on disk for a run: how to send it again, and what it spent."""

    run: str
    zones: list[str]
    #: The `Forja.train` keyword arguments that sent the run (config, script, args, project...);
    #: empty when the watcher was started by hand: then it restarts in place but cannot move zones.
    #: A run sent again from a snapshot (`forja train --again RUN --managed`) keeps "again": RUN
    #: instead of its config and project, which lived in temporary folders: a move puts them back.
    train: dict[str, Any] = field(default_factory=dict)
    tally: Tally = field(default_factory=Tally)

    @classmethod
    def path(cls, run: str) -> Path:
        return forja_home() / "watch" / f"{run}.json"

    @classmethod
    def load(cls, run: str) -> WatchState | None:
        try:
            raw = json.loads(cls.path(run).read_text())
        except FileNotFoundError:
            return None
        tally = raw.get("tally") or {}
        tally["failed_zones"] = tuple(tally.get("failed_zones") or ())
        return cls(
            run=raw["run"], zones=list(raw["zones"]), train=dict(raw.get("train") or {}), tally=Tally(**tally)
        )

    def save(self) -> None:
        path = self.path(self.run)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1, default=str))
        tmp.replace(path)


def watch_lock(run: str) -> contextlib.AbstractContextManager[None]:
    """Hold the run's watcher lock, or refuse naming the process that holds it."""
    return process_lock.held(forja_home() / "watch" / f"{run}.lock", lambda holder: WatchError(
        f"run {run!r} is already watched ({holder}); two watchers would both restart and move "
        f"the VM. Stop that one first, or let it go on."))


def seconds(text: str, option: str) -> float:
    """'90', '90s', '45m', '6h', '2d' or '1d12h' as seconds (plugins/module_utils/forja_durations.py,
    the one reader of durations); anything else is an error naming the option."""
    try:
        return float(module_utils.load("forja_durations").seconds(text))
    except ValueError as exc:
        raise errors.ConfigError(option, str(exc)) from None


def zone_vars(zones: Sequence[str]) -> dict[str, Any]:
    """The gcp_instance variables that put the VM in the first zone, the rest as fallbacks."""
    return {"gcp_instance_zone": zones[0], "gcp_instance_fallback_zones": list(zones[1:])}


class Watcher:
    """Observe, decide, act, until the run ends or a budget is spent.

    Args:
        session: the project's session (its inventory and extravars are the run's).
        state: the run, its zones (the first is where it runs now) and how to send it again.
        budget: when to stop trying.
        poll_s: seconds between looks at the VM (each look is one small playbook).
        say: where lines for people go (the CLI prints them).
        down_usd_per_s: what an outage costs per second (the boot disk); None: price it from forja's table.
    """

    def __init__(
        self,
        session: Session,
        state: WatchState,
        budget: RecoveryBudget | None = None,
        *,
        poll_s: float = POLL_S,
        say: Callable[[str], None] = print,
        down_usd_per_s: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.session = session
        self.state = state
        self.budget = budget or RecoveryBudget()
        self.budget.check()
        self.poll_s = poll_s
        self.say = say
        self.down_usd_per_s = down_usd_per_s
        self.sleep = sleep
        self.last_step: int | None = None
        #: The watched VM's name (observe.yml's key): its run queue's mirror is named for it.
        self.vm_name: str | None = None
        #: The VM's run queue as mirrored to the bucket, read by a zone move before the old VM goes.
        self.mirrored_queue: list[dict[str, Any]] = []

    # -- observing ---------------------------------------------------------------------------
    def observe(self) -> InstanceState:
        found = lifecycle.observe(self.session, zone_vars(self.state.zones))
        if len(found) != 1:
            raise WatchError(
                f"observe.yml reported {len(found)} VMs ({', '.join(found) or 'none'}); "
                "a managed run watches exactly one"
            )
        self.vm_name = next(iter(found))
        return found[self.vm_name]

    def run_status(self, vm: InstanceState) -> str | None:
        """The run's status from its host while the VM runs; otherwise what the history last knew.

        A host that does not answer now (booting, busy, the network) is not a verdict: the next look
        asks again (None: unknown)."""
        if vm.running:
            try:
                states = following.status(self.session, self.state.run)
            except (errors.HostUnreachable, errors.PlaybookFailed) as exc:
                self.say(f"the run's host did not answer ({exc.message.splitlines()[0][:120]}); asking again")
                return None
            for status in states:
                if status.step is not None:
                    self.last_step = status.step
                return status.status
        try:
            return self.session.history.find(self.state.run).status
        except errors.ForjaError:  # a run site.yml sent, not recorded here yet
            return None

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> str:
        """Watch until the run ends (returns why) or a budget is spent (raises WatchError)."""
        spent = over_budget(self.state.tally, self.budget)
        if spent:  # a watcher started again on a run that already spent its budget
            raise WatchError(f"run {self.state.run} has spent its budget already: {spent}. Raise that limit "
                             "to watch it again.")
        with watch_lock(self.state.run):
            self.say(
                f"watching run {self.state.run} (zones {', '.join(self.state.zones)}; "
                f"a look every {self.poll_s:.0f} s; Ctrl-C stops watching, not the run)"
            )
            vm = self.observe()
            if vm.exists and not vm.spot:
                self.say(
                    f"{vm.zone}: the VM is on-demand, so Google does not preempt it; the watcher still "
                    "brings it back if it is stopped by a host error, and moves it if the VM is gone"
                )
            while True:
                status = self.run_status(vm)
                decision = self.act(vm, status)
                if decision.action == "done":
                    self.say(f"stopped watching: {decision.reason}")
                    following.announce_end(self.session, self.state.run, status or "stopped", [],
                                           decision.reason)
                    return decision.reason
                if decision.action == "give_up":
                    self._event("gave_up", reason=decision.reason)
                    raise WatchError(
                        f"gave up on run {self.state.run}: {decision.reason}. The VM is left as it "
                        "is; `forja up` and `forja watch` start again by hand."
                    )
                if decision.action == "watch":
                    self.sleep(self.poll_s)
                vm = self.observe()

    def act(self, vm: InstanceState, status: str | None) -> Decision:
        """One look's work: count the outage so far, decide, and restart or move the VM when that is
        the decision ("done" and "give_up" are the caller's). The loop of `run`; a sweep's runner calls
        it on each look that finds its trials' VM down (forja.sweep_runners), so a VM still shutting
        down is waited for, and one preemption is one recovery however often it is looked at."""
        self._account(vm)  # the outage so far counts in this decision
        decision = decide(vm, status, self.state.tally, self.budget, self.state.zones)
        if decision.action == "restart":
            self._restart(vm, decision)
        elif decision.action == "move":
            self._move(vm, decision)
        return decision

    def _account(self, vm: InstanceState) -> None:
        """Count time and money down while the VM is not running; close the outage when it runs."""
        tally, now = self.state.tally, time.time()
        if vm.running:
            if tally.down_since is not None:
                self._set_tally(down_since=None)
            return
        if tally.down_since is None:
            self._set_tally(down_since=now)
            return
        spent = now - tally.down_since
        rate = self.down_usd_per_s if self.down_usd_per_s is not None else self._disk_rate(vm)
        self._set_tally(down_s=tally.down_s + spent, down_usd=tally.down_usd + spent * rate, down_since=now)

    def _disk_rate(self, vm: InstanceState) -> float:
        """USD per second the kept boot disk costs (0 when the VM is gone or unpriced)."""
        if not vm.exists or not vm.boot_disk_size_gb:
            return 0.0
        from forja.cost.prices import PriceError, load_prices, region_of

        try:
            prices = load_prices(None)
            disk = prices.disk_price("pd-balanced", region_of(vm.zone))
        except PriceError:
            return 0.0
        return disk.usd_per_gb_month * vm.boot_disk_size_gb / (prices.hours_per_month * 3600.0)

    def _set_tally(self, **changes: Any) -> None:
        self.state.tally = replace(self.state.tally, **changes)
        self.state.save()

    def _event(self, kind: str, **data: Any) -> None:
        tally = self.state.tally
        data.update(seconds_down=round(tally.down_s, 1), usd_down=round(tally.down_usd, 6))
        with contextlib.suppress(errors.ForjaError):  # a run sent by site.yml may not be recorded yet
            self.session.history.record_event(self.state.run, kind, **data)
        shown = {**data, "seconds_down": fmt.duration(tally.down_s), "usd_down": fmt.money(tally.down_usd)}
        line = f"{kind.replace('_', ' ')}: " + ", ".join(
            f"{k.replace('_', ' ')} {v}" for k, v in shown.items() if v not in (None, ""))
        self.say(line)
        # posted in the background the moment the watcher sees it (forja/notify.py); never blocks
        following.announce(self.session, kind, self.state.run, f"run {self.state.run}: {line}", **data)

    def _restart(self, vm: InstanceState, decision: Decision) -> None:
        zone = decision.zones[0]
        self._event("preempted", at=vm.preempted_at, zone=zone, last_step=self.last_step)
        self._set_tally(recoveries=self.state.tally.recoveries + 1)
        try:
            lifecycle.up(self.session, zone_vars([zone]))
        except errors.PlaybookFailed as exc:
            if exc.code not in stockout_codes():
                raise
            self._set_tally(failed_zones=(*self.state.tally.failed_zones, zone))
            self._event("stockout", zone=zone)
            return  # the next look decides the move
        self._event("restarted", zone=zone)

    def _by_advice(self, zones: Sequence[str]) -> tuple[tuple[str, ...], dict[str, Any]]:
        """The zones to move to, ranked by Google's capacity advice (`forja.zones`); those that ran
        out stay last. The given order when the advice has no signal. Also what the history keeps of
        why: the signal and the scores seen."""
        failed = [z for z in zones if z in self.state.tally.failed_zones]
        ranked, report = zone_advice.ranked(self.session, [z for z in zones if z not in failed])
        why = {"zone_signal": report.signal if report else "no signal",
               "zone_scores": zone_advice.scores(report, ranked)}
        return tuple([*ranked, *failed]), why

    def can_send_again(self) -> bool:
        """Whether a move can send the work again on the new VM (a watcher started by hand cannot)."""
        return bool(self.state.train)

    def send_again(self) -> None:
        """Send the run again on the VM a move made: it resumes from its newest checkpoint in the
        bucket; then the runs of the old VM's queue (`mirrored_queue`). A sweep's watcher sends each of
        its trials that were on that VM instead (they were its queue)."""
        with resent(self.session, self.state.run, self.state.train) as how:
            training.train(self.session, **how)
        self._restore_queue(self.mirrored_queue)

    def _move(self, vm: InstanceState, decision: Decision) -> None:
        if not self.can_send_again():
            raise WatchError(
                f"run {self.state.run} must move out of {vm.zone or 'its zone'} ({decision.reason}), which "
                "needs the run sent again; this watcher was started without how it was sent. Start managed "
                "runs with `forja train --managed` (or Forja.train_managed)."
            )
        self.mirrored_queue = self._mirrored_queue()  # before the new VM mirrors its own under the name
        if vm.exists:
            lifecycle.teardown(self.session, delete=True, extravars=zone_vars([vm.zone]))
        self._set_tally(recoveries=self.state.tally.recoveries + 1)
        zones, advice = self._by_advice(decision.zones)
        try:  # the zones in the advice's order; the module must not reorder them again
            lifecycle.up(self.session, {**zone_vars(zones), "gcp_instance_zone_order": "given"})
        except errors.PlaybookFailed as exc:
            if exc.code not in stockout_codes():
                raise
            self._set_tally(failed_zones=(*self.state.tally.failed_zones, *zones))
            self._event("stockout", zones=list(zones))
            return
        moved_to = self.observe().zone or zones[0]
        self.state.zones = list(zone_order([moved_to, *self.state.zones], ()))
        self.state.save()
        self._event("zone_moved", from_zone=vm.zone, to_zone=moved_to, zone_order=list(zones), **advice)
        lifecycle.configure(self.session, extravars=zone_vars(self.state.zones))
        self.send_again()

    def _mirrored_queue(self) -> list[dict[str, Any]]:
        """The VM's run queue as it last mirrored it to the bucket; [] when unknown (said, never fatal:
        the watched run moves all the same)."""
        from forja import queue as run_queue

        try:
            return run_queue.mirrored(self.session, self.vm_name) if self.vm_name else []
        except Exception as exc:  # the bucket's client, auth, the network: the move must go on
            self.say(f"the VM's run queue could not be read from the bucket ({type(exc).__name__}: "
                     f"{str(exc)[:200]}); queued runs are not sent again (forja queue, forja train --queue)")
            return []

    def _restore_queue(self, entries: list[dict[str, Any]]) -> None:
        """Queue the mirrored runs again on the new VM, in their order, and record it."""
        from forja import queue as run_queue

        if not entries:
            return
        sent = run_queue.restore(self.session, entries, training.train, skip=self.state.run, say=self.say)
        if sent:
            self._event("queue_restored", runs=sent)


def to_send_again(sent: Mapping[str, Any], again: str | None = None) -> dict[str, Any]:
    """What a managed run's watcher keeps of how the run was sent (`train`'s keywords), to send it again
    after a zone move: the same run resumed, never a second replacement (no wait, name, cancel, on_event
    nor replace; `resent` sets the name). A run sent from a snapshot (`again`, forja.again) keeps that
    run's name instead of its config and project, which lived in temporary folders gone by then."""
    how = {k: v for k, v in sent.items() if k not in ("wait", "name", "cancel", "on_event", "replace")}
    if again is None:
        return how
    return {**{k: v for k, v in how.items() if k not in ("config", "project")}, "again": again}


@contextlib.contextmanager
def resent(session: Session, run: str, kept: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """`train`'s keywords that send run `run` again on the VM a zone move made, from what its watcher
    kept (`to_send_again`): under its own name, not waited for; it resumes from its newest checkpoint in
    the bucket. A run kept as sent from a snapshot gets its config and code put back from there, as when
    it was first sent (forja.snapshot.again: a temporary worktree of its commit and patch while the
    context lives), under the options it was sent with, the caller's -e variables among them."""
    how = {**kept, "name": run, "wait": False}
    again = how.pop("again", None)
    if again is None:
        yield how
        return
    with snapshot.again(session, again) as plan:
        yield {**plan.keywords(), **how}


def checked_request(fallback_zones: Sequence[str], budget: RecoveryBudget | None) -> RecoveryBudget:
    """The budget of a managed run (the default one when None), refused with the option to fix
    before anything runs: a budget spent before it starts, or no zone to move to."""
    budget = budget or RecoveryBudget()
    budget.check()
    if not fallback_zones:
        raise errors.ConfigError("--fallback-zone", "a managed run needs at least one zone to move to on a "
                                 "stock-out (e.g. --fallback-zone us-east1-b)")
    return budget


def start_state(run: str, zones: Sequence[str], train: Mapping[str, Any] | None = None) -> WatchState:
    """The state of a new watch: a run just sent (`train` given) starts a new tally; a watcher started
    again on a run it watched before (`forja watch`, no `train`) goes on with the kept one."""
    if not zones:
        raise errors.ConfigError(
            "--zone", "name the zone the run's VM is in (and --fallback-zone for others)"
        )
    if len(set(zones)) < 2:
        raise errors.ConfigError(
            "--fallback-zone",
            f"names only {zones[0]}, the run's own zone: a stock-out there would leave the "
            "run down with nowhere to go. Name at least one other zone that has the GPU (e.g. "
            "--fallback-zone us-east1-b --fallback-zone us-central1-a)",
        )
    kept = None if train else WatchState.load(run)
    if kept is not None:
        kept.zones = list(dict.fromkeys([*kept.zones[:1], *zones]))
        return kept
    return WatchState(run=run, zones=list(dict.fromkeys(zones)), train=dict(train or {}))


def watch(
    session: Session,
    name: str,
    *,
    fallback_zones: Sequence[str],
    budget: RecoveryBudget | None = None,
    train: Mapping[str, Any] | None = None,
    poll_s: float = POLL_S,
    say: Callable[[str], None] = print,
    notify: str | bool | None = None,
) -> str:
    """Keep a run going on a Spot VM with nobody at the keyboard; returns why watching ended.

    A preempted VM is started again in its zone; one whose zone ran out of capacity (or that is
    gone) is made again in the next of `fallback_zones`, configured with the same playbooks, and
    the run is sent again (`train`: how it was sent, as `Forja.train`'s keywords), resuming from
    its newest checkpoint in the bucket. `budget` (`forja.managed.RecoveryBudget`) says when to stop
    trying. One watcher per run: a second raises WatchError naming the first. Every transition
    goes into the run's history. See forja/managed.py for the whole policy. `notify` posts each
    transition to a webhook as `train`'s `notify` does.
    """
    budget = checked_request(fallback_zones, budget)
    following.notifications_for(session, notify)
    found = lifecycle.observe(session)
    if len(found) != 1:
        raise errors.ConfigError("gcp_instance_name",
                                 f"a managed run needs exactly one VM; found {len(found)}")
    vm = next(iter(found.values()))
    if not vm.exists:
        raise errors.ConfigError("gcp_instance_name", "the run's VM does not exist; `forja up` creates it")
    state = start_state(name, [vm.zone, *fallback_zones], train)
    return Watcher(session, state, budget, poll_s=poll_s, say=say).run()


def train_managed(
    session: Session,
    config: str | Path | None = None,
    *,
    fallback_zones: Sequence[str],
    budget: RecoveryBudget | None = None,
    poll_s: float = POLL_S,
    say: Callable[[str], None] = print,
    notify: str | bool | None = None,
    again: str | None = None,
    **train: Any,
) -> str:
    """`forja train --managed`: send a run (`train`'s keywords, never waiting), then `watch` it.

    The budget, the zones and the webhook (`notify`, as `train`'s) are checked before anything is
    sent. Returns why watching ended. `again` names the run whose snapshot this one was sent from
    (forja.again): a recovery that must send it again puts its code and config back from there.
    """
    if session.cluster is not None:
        raise errors.ConfigError("--cluster", "a managed run watches one VM; drop --managed to train on "
                                              "a cluster (its elastic torchrun outlives a lost member)")
    budget = checked_request(fallback_zones, budget)
    following.notifications_for(session, notify)  # before anything is sent
    sent = {"config": str(config) if config else None, **train, "wait": False}
    result = training.train(session, **sent)
    say(f"run {result.run_id} started; watching it")
    return watch(session, result.run_id, fallback_zones=fallback_zones, budget=budget,
                 train=to_send_again(sent, again), poll_s=poll_s, say=say)
