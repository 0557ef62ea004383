"""`forja sweep`: a hyperparameter search with Optuna, each trial an ordinary forja run.

Why ask/tell on the controller (../shared/notes/peers-3.md, Optuna): the study lives where forja's
control plane lives, in SQLite under forja's home, never on the VM (a preemption would take it) and
never on shared storage (SQLite cannot lock over a bucket or NFS). After each `tell` the study is
copied to the inventory's bucket (gs://BUCKET/sweeps/NAME/), so a laptop that sleeps or dies picks
the sweep up with `forja sweep resume NAME`, here or on another machine. Optuna's own retry of dead
trials works only with `study.optimize()` and RDB storage, not ask/tell; so the loop here is the
heartbeat: it looks at every running trial each poll, and a trial's run decides how it ended.

Each trial is a run named SWEEP-tNNN, sent with the sweep's config plus the trial's values
(`forja.sweep_space.trial_config`), with its own checkpoints, live metrics, cost and history row:
`forja status`, `forja logs`, `forja cost --run` all work on it. A trial runner
(`forja.sweep_runners`) sends, looks at and stops them: on the inventory's VMs (into the VM's run
queue when forja has one, else one trial per VM), or as trainer processes on this machine.

The loop, each poll: ask new trials while slots are free (and one more ahead when the VM queues, so
the next starts the moment the GPU frees), look at the running ones, feed each metric line since the
last look to `trial.report` at its step and stop those the pruner prunes, bring a preempted one back
from its checkpoint (on the VMs through the managed watcher, `forja train --managed`'s: a restart, or
a zone move to a fallback zone; one preemption is one recovery, however many looks it spans), tell
the ended ones, check the budget. Everything Optuna does not keep (which run a trial is, its cost, why
it failed) is a trial user attribute, so the study alone is the sweep's whole state.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forja import defaults, errors, managed, process_lock, sweep_space
from forja import format as fmt
from forja.paths import forja_home
from forja.runs import RUN_NAME, now

if TYPE_CHECKING:
    import optuna

    from forja.session import Session
    from forja.sweep_runners import Look, TrialRunner

#: Seconds between two looks at the running trials (one status playbook per VM).
POLL_S = defaults.SWEEP_POLL_S
#: How long a sent trial may be on none of the hosts (not queued, not running) before it is told FAIL.
LOST_AFTER_S = 600.0
#: What a sweep's name may be: a run name with room for "-tNNN" (the trials' names).
NAME_MAX = 58
#: The study's objects in the bucket, under its name.
BUCKET_PREFIX = "sweeps"

Say = Callable[[str], None]


@dataclass
class SweepSpec:
    """What a sweep is, kept beside its study (sweep.json), so `resume` needs nothing but the name."""

    name: str
    config: str
    space: str
    trials: int
    parallel: int = 1
    metrics: list[str] = field(default_factory=lambda: [sweep_space.DEFAULT_METRIC])
    directions: list[str] = field(default_factory=lambda: [sweep_space.DEFAULT_DIRECTION])
    max_usd: float | None = None
    max_hours: float | None = None
    cluster: str | None = None
    project: str | None = None
    #: Where the trials run: "vm" (the inventory's hosts) or "local" (trainer processes here).
    where: str = "vm"
    prune: bool = True
    #: Zones a trial's VM is made again in when it is gone or its zone has no capacity left: `forja
    #: train --managed`'s --fallback-zone (empty: a VM is only started again where it is).
    fallback_zones: list[str] = field(default_factory=list)
    #: Most recoveries (restarts and zone moves) of one trial, as --max-recoveries of a managed run.
    max_recoveries: int = managed.MAX_RECOVERIES
    #: Most seconds each VM may be down, and dollars spent while down, over the whole sweep (--max-down,
    #: --max-down-usd); None: the managed watcher's default, and no limit.
    max_down_s: float | None = None
    max_down_usd: float | None = None
    created_at: str = field(default_factory=now)
    #: Seconds this sweep has been driven, all sessions together (what --max-hours counts).
    driven_s: float = 0.0
    #: Why it stopped sending new trials, once it has (a budget, or all trials asked).
    stopped: str | None = None

    @staticmethod
    def folder_of(name: str) -> Path:
        return forja_home() / "sweeps" / name

    @property
    def folder(self) -> Path:
        return self.folder_of(self.name)

    @property
    def config_copy(self) -> Path:
        """The config as the sweep started from it, kept (and mirrored) beside the study: a sweep
        resumed on another machine, or after the file changed, sends the same trials."""
        return self.folder / "config.yaml"

    @property
    def space_copy(self) -> Path:
        return self.folder / "space.yaml"

    @property
    def storage_url(self) -> str:
        return f"sqlite:///{self.folder / 'study.db'}"

    def vm_budget(self) -> managed.RecoveryBudget:
        """What each VM's managed watcher may spend over the sweep (`vm_budget`)."""
        budget = managed.RecoveryBudget(max_recoveries=self.max_recoveries, max_down_usd=self.max_down_usd)
        budget = budget if self.max_down_s is None else replace(budget, max_down_s=self.max_down_s)
        return vm_budget(budget, self.trials)

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / "sweep.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.folder / "sweep.json")

    @classmethod
    def load(cls, name: str) -> SweepSpec | None:
        try:
            raw = json.loads((cls.folder_of(name) / "sweep.json").read_text())
        except FileNotFoundError:
            return None
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})


@dataclass(frozen=True)
class TrialRow:
    """One trial as `forja sweep status` shows it."""

    number: int
    run: str
    params: dict[str, Any]
    values: list[float] | None
    state: str
    #: The run's cost, settled at its end (docs/cost-definition.md): what `forja runs` shows for it.
    #: None until then (it runs), or when no rate is known.
    cost_usd: float | None
    seconds: float | None
    reason: str = ""
    best: bool = False
    #: Of which training: the trainer's own count (so far, while it runs), a part of the run's cost.
    training_usd: float | None = None

    @property
    def counted_usd(self) -> float | None:
        """What --max-usd counts for the trial: its cost once settled, else the trainer's own count so
        far, a floor of it (the setup before the trainer, the fetch after it and the disk come on top)."""
        return self.cost_usd if self.cost_usd is not None else self.training_usd


@dataclass(frozen=True)
class SweepReport:
    """What a sweep did: its trials, the best (the Pareto front of several objectives), its plots, and
    why it stopped."""

    name: str
    metrics: list[str]
    directions: list[str]
    trials: list[TrialRow]
    best_runs: list[str]
    #: What --max-usd counts: each trial's settled cost, else the trainer's own count so far (a floor).
    spent_usd: float
    driven_s: float
    stopped: str | None
    plots: list[str] = field(default_factory=list)
    folder: str = ""
    #: The trials counted in spent_usd at the trainer's own count: not settled yet (or no rate known).
    unsettled: int = 0


def vm_budget(budget: managed.RecoveryBudget, trials: int) -> managed.RecoveryBudget:
    """A VM's managed watcher serves every trial sent to it: --max-recoveries counts per trial (as per
    managed run), so the VM may make that many for each trial; the time and money down count over the
    whole sweep."""
    return replace(budget, max_recoveries=budget.max_recoveries * trials)


# -- checking what is asked, before anything is created ---------------------------------------------
def default_name(config: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]", "-", config.stem)[:30] or "sweep"
    return f"{stem}-sweep-{time.strftime('%m%d-%H%M%S')}"


def checked_sweep_name(name: str) -> str:
    """A name whose trials' names (NAME-tNNN) are run names; a ConfigError naming the fix otherwise."""
    if len(name) > NAME_MAX or not RUN_NAME.match(name):
        raise errors.ConfigError("--name", f"{name!r} must be 1-{NAME_MAX} letters, digits, '-' or '_' "
                                 "(first a letter or digit): each trial is a run named NAME-tNNN")
    return name


def trial_run(name: str, number: int) -> str:
    """The run a trial is: SWEEP-t007."""
    return f"{name}-t{number:03d}"


def _refuse_used_name(session: Session | None, name: str) -> None:
    """A name is one study's: a second sweep under it would mix two searches in one study."""
    known = SweepSpec.load(name)
    elsewhere = known is None and session is not None and _bucket_has(session, name)
    if known is not None or elsewhere:
        where = "here" if known else "in the bucket"
        raise errors.ConfigError(
            "--name", f"sweep {name!r} already exists ({where}: another study); go on with it with "
            f"`forja sweep resume {name}`, see it with `forja sweep status {name}`, or give a new --name"
        )


def _check_numbers(trials: int, parallel: int, max_usd: float | None, max_hours: float | None) -> None:
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise errors.ConfigError("--trials", f"{trials!r} is not a number of trials >= 1")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise errors.ConfigError("--parallel", f"{parallel!r} is not a number >= 1")
    if parallel > trials:
        raise errors.ConfigError("--parallel", f"{parallel} trials at once is more than the {trials} trials "
                                 "asked; lower --parallel or raise --trials")
    for option, value in (("--max-usd", max_usd), ("--max-hours", max_hours)):
        if value is not None and not value > 0:
            raise errors.ConfigError(option, f"{value} leaves no room for a trial; give more than 0 "
                                     "(or omit it)")


# -- the study ------------------------------------------------------------------------------------
def open_study(spec: SweepSpec, *, create: bool) -> optuna.Study:
    """The sweep's Optuna study in its SQLite file (made when `create`): TPE (Optuna 5's default,
    multivariate with constant liar, so trials asked while others run spread out) and a median
    pruner that waits for a few trials and steps before it judges."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec.folder.mkdir(parents=True, exist_ok=True)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
              if spec.prune and len(spec.metrics) == 1 else optuna.pruners.NopPruner())
    kwargs: dict[str, Any] = {"study_name": spec.name, "storage": spec.storage_url, "pruner": pruner}
    if create:
        return optuna.create_study(directions=spec.directions, load_if_exists=False, **kwargs)
    return optuna.load_study(**kwargs)


def _attr(trial: Any, key: str, default: Any = None) -> Any:
    return trial.user_attrs.get(key, default)


def spent_usd(study: optuna.Study) -> float:
    """What every trial cost so far, as --max-usd counts it (`TrialRow.counted_usd`): each ended run's
    settled cost, and for a trial still running (or one whose run no rate prices) the trainer's own
    count so far, a floor of its cost."""
    return _spent(rows(study))


def _spent(found: Sequence[TrialRow]) -> float:
    return float(sum(row.counted_usd or 0.0 for row in found))


#: What a trial's cost marked ≥ means, where `forja sweep status` and the dashboard show one.
FLOOR_NOTE = ("cost: the trial's run as `forja runs` shows it, settled at its end; ≥ marks one not settled "
              "yet, shown and counted by --max-usd at the trainer's own count so far, a floor")


def cost_words(row: TrialRow) -> str:
    """A trial's cost for people: the run's settled cost, else the trainer's count so far marked as a
    floor ("≥0.5¢ training so far"), as `forja sweep status` and the dashboard show it."""
    if row.cost_usd is not None:
        return fmt.money(row.cost_usd)
    if row.training_usd is not None:
        return f"≥{fmt.money(row.training_usd)} training so far"
    return "-"


def over_budget(spec: SweepSpec, study: optuna.Study, driven_s: float) -> str | None:
    """Which budget is reached, in words; None while new trials may start."""
    spent = spent_usd(study)
    if spec.max_usd is not None and spent >= spec.max_usd:
        return f"--max-usd {fmt.money(spec.max_usd)} reached ({fmt.money(spent)} spent)"
    if spec.max_hours is not None and driven_s >= spec.max_hours * 3600:
        return f"--max-hours {spec.max_hours:g} reached ({fmt.duration(driven_s)} driven)"
    return None


# -- the bucket copy -------------------------------------------------------------------------------
#: Each session's bucket, found once: finding it reads the inventory (an ansible-inventory process).
_BUCKETS: weakref.WeakKeyDictionary[Any, tuple[Any, str] | None] = weakref.WeakKeyDictionary()


def _bucket(session: Session) -> tuple[Any, str] | None:
    """(client, bucket name) of the inventory's bucket, as `forja data push` finds it; None without one."""
    if session not in _BUCKETS:
        _BUCKETS[session] = _find_bucket(session)
    return _BUCKETS[session]


def _find_bucket(session: Session) -> tuple[Any, str] | None:
    from forja import datasets

    if session.inventory is None:
        return None
    try:
        url = datasets.settings(session, None)["bucket"]
    except errors.ForjaError:
        return None
    if not url:
        return None
    mod = datasets.dataset_module()
    return datasets.storage_client(session, url), mod.bucket_from_url(url)


def _bucket_has(session: Session, name: str) -> bool:
    found = _bucket(session)
    if found is None:
        return False
    client, bucket = found
    return client.bucket(bucket).blob(f"{BUCKET_PREFIX}/{name}/sweep.json").exists()


def mirror(found: tuple[Any, str] | None, spec: SweepSpec) -> bool:
    """Copy the study (a consistent snapshot: SQLite's backup, never the live file) and sweep.json to
    the bucket `found` (`_bucket`) under sweeps/NAME/. False when there is none."""
    if found is None:
        return False
    client, bucket_name = found
    bucket = client.bucket(bucket_name)
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / "study.db"
        with contextlib.closing(sqlite3.connect(spec.folder / "study.db")) as live, \
                contextlib.closing(sqlite3.connect(snapshot)) as copy:
            live.backup(copy)
        bucket.blob(f"{BUCKET_PREFIX}/{spec.name}/study.db").upload_from_filename(str(snapshot))
    for kept in (spec.config_copy, spec.space_copy):
        blob = bucket.blob(f"{BUCKET_PREFIX}/{spec.name}/{kept.name}")
        if not blob.exists():  # written once: the sweep never changes them
            blob.upload_from_filename(str(kept))
    bucket.blob(f"{BUCKET_PREFIX}/{spec.name}/sweep.json").upload_from_string(
        (spec.folder / "sweep.json").read_text(), content_type="application/json")
    return True


def restore(session: Session, name: str) -> SweepSpec | None:
    """The sweep from the bucket when this machine has none (another laptop's, or a lost disk)."""
    found = _bucket(session)
    if found is None:
        return None
    client, bucket_name = found
    bucket = client.bucket(bucket_name)
    blob = bucket.blob(f"{BUCKET_PREFIX}/{name}/sweep.json")
    if not blob.exists():
        return None
    folder = SweepSpec.folder_of(name)
    folder.mkdir(parents=True, exist_ok=True)
    for kept in ("study.db", "config.yaml", "space.yaml"):
        bucket.blob(f"{BUCKET_PREFIX}/{name}/{kept}").download_to_filename(str(folder / kept))
    (folder / "sweep.json").write_text(blob.download_as_text())
    return SweepSpec.load(name)


# -- the loop --------------------------------------------------------------------------------------
@dataclass
class _Running:
    trial: Any  # optuna.Trial
    run: str
    slot: int
    sent_at: float
    last_step: int | None = None
    unseen_since: float | None = None
    #: Preempted and not seen running since: later looks are the same preemption, not a new one.
    down: bool = False


class Driver:
    """Ask, send, look, report, prune, recover, tell; until every trial is told or a budget stops it.

    Args:
        spec: the sweep.
        study: its Optuna study.
        runner: sends and looks at trial runs (forja.sweep_runners).
        session: for the bucket copy and the history (None: neither, local only).
        poll_s: seconds between two looks.
        say: where lines for people go.
    """

    def __init__(self, spec: SweepSpec, study: optuna.Study, runner: TrialRunner, *,
                 session: Session | None, poll_s: float = POLL_S, say: Say = print,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec, self.study, self.runner, self.session = spec, study, runner, session
        self.poll_s, self.say, self.sleep = poll_s, say, sleep
        self.space = sweep_space.load(spec.space_copy, spec.config_copy, metrics=spec.metrics,
                                      directions=spec.directions)
        self.distributions = self.space.distributions()
        self.running: dict[str, _Running] = {}
        #: What feeds the pruner (`_prune_key`), once a metric line has been seen; "" for nothing.
        self.prune_key: str | None = None
        #: The bucket the study is copied to, found once (reading the inventory is a process).
        self.bucket = _bucket(session) if session is not None else None

    def _prune_key(self, line: Mapping[str, Any]) -> str | None:
        """What of a run's metric lines feeds `trial.report`, decided on the first line seen: the
        objective itself when the lines carry it, else the training loss when the objective is
        minimized (a loss); None: no pruning (several objectives, which Optuna does not prune, or a
        maximized one the lines do not carry)."""
        if not self.spec.prune or len(self.spec.metrics) != 1:
            return None
        metric = self.spec.metrics[0]
        if metric in line:
            return metric
        return "loss" if self.spec.directions[0] == "minimize" else None

    # -- the whole loop --------------------------------------------------------------------------
    def run(self) -> SweepReport:
        with driving(self.spec):
            return self._run()

    def _run(self) -> SweepReport:
        import optuna

        self._adopt()
        session_start, driven_before = time.monotonic(), self.spec.driven_s
        while True:  # send at once what a trial's end freed, then look again after a poll
            driven = driven_before + (time.monotonic() - session_start)
            self.spec.driven_s = driven
            self._send_new(driven)
            if not self.running:
                break
            self.sleep(self.poll_s)
            looks = self.runner.look(list(self.running))
            for run, look in looks.items():
                self._judge(self.running[run], look)
            self.spec.save()
        self.spec.save()
        self._mirror()
        told = [t for t in self.study.get_trials(deepcopy=False)
                if t.state != optuna.trial.TrialState.RUNNING]
        self.say(f"sweep {self.spec.name}: {len(told)} trials told; {self.spec.stopped or 'done'}")
        return finish(self.spec, self.study, self.session, runner=self.runner, say=self.say)

    def _adopt(self) -> None:
        """Trials a previous session sent and never told (its laptop slept): watch them again."""
        import optuna

        for frozen in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            run = _attr(frozen, "run")
            if run is None:  # asked, never sent: nothing runs it
                self.study.tell(frozen.number, state=optuna.trial.TrialState.FAIL)
                continue
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            self.runner.adopt(run, self.spec.folder / "trials" / f"{run}.yaml", _attr(frozen, "slot", 0))
            self.running[run] = _Running(trial, run, _attr(frozen, "slot", 0), time.monotonic(),
                                         last_step=max(frozen.intermediate_values, default=None))
            self.say(f"{run}: sent by an earlier session; watching it again")

    def _asked(self) -> int:
        """Trials asked so far; those enqueued (`first`) and not yet asked are still to come."""
        import optuna

        waiting = optuna.trial.TrialState.WAITING
        return sum(t.state != waiting for t in self.study.get_trials(deepcopy=False))

    def _send_new(self, driven: float) -> None:
        """Ask and send trials while a slot is free (plus those the VM queues ahead), within the budget."""
        room = self.runner.slots() + self.runner.ahead
        while len(self.running) < min(room, self.spec.parallel + self.runner.ahead):
            if self.spec.stopped:  # a budget, all trials sent, or a trial that could not be sent
                return
            if self._asked() >= self.spec.trials:
                self.spec.stopped = f"all {self.spec.trials} trials sent"
                return
            spent = over_budget(self.spec, self.study, driven)
            if spent:
                self.spec.stopped = f"{spent}: no new trials; those running go on to their end"
                self.say(f"sweep {self.spec.name}: {self.spec.stopped}")
                return
            self._send_one()

    def _send_one(self) -> None:
        import optuna

        trial = self.study.ask(self.distributions)
        run = trial_run(self.spec.name, trial.number)
        busy = {r.slot for r in self.running.values()}
        slot = next((s for s in range(self.runner.slots()) if s not in busy), 0)
        trial.set_user_attr("run", run)
        trial.set_user_attr("slot", slot)
        try:
            config = sweep_space.trial_config(self.spec.config_copy, trial.params,
                                              self.spec.folder / "trials" / f"{run}.yaml")
            self.runner.start(run, config, slot)
        except errors.ForjaError as exc:
            trial.set_user_attr("reason", exc.message[:500])
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            # what stopped one trial stops the next (a VM down, a bad value): no trials burnt on it
            self.spec.stopped = (f"{run} could not be sent ({exc.message.splitlines()[0][:200]}); fix that, "
                                 f"then `forja sweep resume {self.spec.name}`")
            self.say(f"sweep {self.spec.name}: {self.spec.stopped}")
            self._mirror()
            return
        self.running[run] = _Running(trial, run, slot, time.monotonic())
        shown = ", ".join(f"{k}={_shown(v)}" for k, v in trial.params.items())
        self.say(f"{run}: sent ({shown})")

    # -- one look at one trial --------------------------------------------------------------------
    def _judge(self, entry: _Running, look: Look) -> None:
        import optuna

        trial = entry.trial
        _keep_costs(trial, look)
        if look.status in ("unknown", "queued"):
            entry.unseen_since = entry.unseen_since or time.monotonic()
            if look.status == "unknown" and time.monotonic() - entry.unseen_since > LOST_AFTER_S:
                self._tell(entry, optuna.trial.TrialState.FAIL,
                           reason=f"on none of the hosts for {fmt.duration(LOST_AFTER_S)}")
            return
        entry.unseen_since = None
        if look.status == "running":
            entry.down = False
            self._report(entry, look)
            return
        if look.status == "completed":
            values = [look.summary.get(m) if look.summary else None for m in self.spec.metrics]
            if any(not isinstance(v, int | float) for v in values):
                missing = [m for m, v in zip(self.spec.metrics, values, strict=True)
                           if not isinstance(v, int | float)]
                self._tell(entry, optuna.trial.TrialState.FAIL,
                           reason=f"completed without {', '.join(missing)} in its summary (set eval in the "
                           "config, or choose another --metric)")
                return
            self._tell(entry, optuna.trial.TrialState.COMPLETE, values=[float(v) for v in values])
            return
        if look.status == "preempted":
            self._recover(entry)
            return
        reason = look.reason or f"its run {look.status}"
        self._tell(entry, optuna.trial.TrialState.FAIL, reason=reason)

    def _recover(self, entry: _Running) -> None:
        """A preempted trial: brought back from its own checkpoint by the runner (on the VMs, the
        managed watcher's restart or zone move), waited for while its VM is on its way, or told FAIL
        with why. Each preemption is one recovery, however many looks it spans; past --max-recoveries
        a new one fails the trial."""
        import optuna

        trial = entry.trial
        recoveries = int(_attr(trial, "recoveries", 0))
        if not entry.down and recoveries >= self.spec.max_recoveries:
            self._tell(entry, optuna.trial.TrialState.FAIL,
                       reason=f"preempted again after {recoveries} recoveries, the most (--max-recoveries "
                       f"{self.spec.max_recoveries})")
            return
        first_look, entry.down = not entry.down, True
        outcome = self.runner.recover(entry.run, entry.slot)
        if outcome.why:
            self._tell(entry, optuna.trial.TrialState.FAIL,
                       reason=f"preempted, and cannot resume: {outcome.why}")
        elif outcome.resumed:
            trial.set_user_attr("recoveries", recoveries + 1)
            self.say(f"{entry.run}: preempted; resuming from its checkpoint (recovery {recoveries + 1})")
        elif first_look:
            self.say(f"{entry.run}: preempted; waiting for its VM")

    def _report(self, entry: _Running, look: Look) -> None:
        """Each metric line not reported yet becomes `trial.report(value, step)`; then the pruner judges."""
        import optuna

        lines = [line for line in (look.series or (look.last,)) if line]
        if self.prune_key is None and lines:
            self.prune_key = self._prune_key(lines[-1]) or ""
        if not self.prune_key:
            return
        reported: float | None = None
        for line in lines:
            step, value = line.get("step"), line.get(self.prune_key)
            if not isinstance(step, int) or not isinstance(value, int | float):
                continue
            if entry.last_step is not None and step <= entry.last_step:
                continue
            entry.trial.report(float(value), step)
            entry.last_step, reported = step, float(value)
        if reported is not None and entry.trial.should_prune():
            stopped = self.runner.stop(entry.run)
            if stopped is not None:
                _keep_costs(entry.trial, stopped)
            self._tell(entry, optuna.trial.TrialState.PRUNED,
                       reason=f"pruned at step {entry.last_step} ({self.prune_key} {reported:.4g})")

    def _tell(self, entry: _Running, state: Any, *, values: Sequence[float] | None = None,
              reason: str = "") -> None:
        if reason:
            entry.trial.set_user_attr("reason", reason[:500])
        self.study.tell(entry.trial, values=values, state=state)
        self.running.pop(entry.run, None)
        said = f"value {', '.join(f'{v:.6g}' for v in values)}" if values else reason
        self.say(f"{entry.run}: {state.name.lower()}{': ' + said if said else ''}")
        self._mirror()

    def _mirror(self) -> None:
        """Save the sweep and copy it to the bucket; a failed upload is said, not fatal (the next
        `tell` copies again)."""
        self.spec.save()
        try:
            mirror(self.bucket, self.spec)
        except Exception as exc:  # the bucket is a copy: the study here goes on
            self.say(f"the study was not copied to the bucket ({type(exc).__name__}: {str(exc)[:120]}); "
                     "the next trial's end tries again")


def _keep_costs(trial: Any, look: Look) -> None:
    """The trial's costs as its run's look reports them (user attributes: the study is the sweep's
    whole state): the trainer's own count so far, and the run's cost once it ended and was settled."""
    if look.training_usd is not None:
        trial.set_user_attr("training_usd", look.training_usd)
    if look.cost_usd is not None:
        trial.set_user_attr("cost_usd", look.cost_usd)


def driving(spec: SweepSpec) -> contextlib.AbstractContextManager[None]:
    """One controller drives a sweep at a time: two would ask, send and tell over each other in one
    SQLite study (the writer Optuna's FAQ warns about). A second is refused naming the first."""
    return process_lock.held(spec.folder / "driver.lock", lambda holder: errors.ConfigError(
        "name", f"sweep {spec.name} is already being driven ({holder}); let it go on, or stop it "
        f"(Ctrl-C) and `forja sweep resume {spec.name}`"))


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


# -- results ---------------------------------------------------------------------------------------
def rows(study: optuna.Study) -> list[TrialRow]:
    """Every trial of the study as a row (its run, values, state, cost, time, why it ended)."""
    import optuna

    best = set(best_numbers(study))
    found = []
    for t in study.get_trials(deepcopy=False):
        end = t.datetime_complete
        seconds = None
        if t.datetime_start is not None:
            seconds = ((end or t.datetime_start.now()) - t.datetime_start).total_seconds()
        found.append(TrialRow(
            number=t.number, run=_attr(t, "run", ""), params=dict(t.params),
            values=list(t.values) if t.values is not None else None,
            state="running" if t.state == optuna.trial.TrialState.RUNNING else t.state.name.lower(),
            cost_usd=_attr(t, "cost_usd"), seconds=seconds, reason=_attr(t, "reason", ""),
            best=t.number in best, training_usd=_attr(t, "training_usd"),
        ))
    return found


def best_numbers(study: optuna.Study) -> list[int]:
    """The best trial's number (one objective), or the Pareto front's (several)."""
    try:
        return [t.number for t in study.best_trials]
    except (ValueError, RuntimeError):
        return []


def save_plots(study: optuna.Study, folder: Path, say: Say = print) -> list[str]:
    """Optuna's optimisation history, parameter importances (PED-ANOVA, Optuna 5's default: no
    scikit-learn) and parallel coordinates as PNG files; a plot the trials cannot make yet (too few
    completed) is skipped and said."""
    import warnings

    try:
        import matplotlib
    except ImportError:  # the trainer extra has it; the controller alone need not
        say("plots not drawn: matplotlib is not installed here (pip install matplotlib, or forja[trainer])")
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as plots

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    stamp, told = folder / ".drawn", str(len(study.get_trials(deepcopy=False)))
    drawn = sorted(str(p) for p in folder.glob("*.png"))
    if drawn and stamp.is_file() and stamp.read_text() == told:  # nothing told since they were drawn
        return drawn
    saved: list[str] = []
    targets = [None] if len(study.directions) == 1 else range(len(study.directions))
    for kind, draw in (("history", plots.plot_optimization_history),
                       ("importances", plots.plot_param_importances),
                       ("parallel", plots.plot_parallel_coordinate)):
        for index in targets:
            suffix = "" if index is None else f"-{index}"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    target = None if index is None else (lambda t, i=index: t.values[i])
                    axes = draw(study, target=target) if target else draw(study)
                figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
                path = folder / f"{kind}{suffix}.png"
                figure.savefig(path, dpi=100, bbox_inches="tight")
                plt.close(figure)
                saved.append(str(path))
            except (ValueError, RuntimeError, ZeroDivisionError) as exc:
                say(f"plot {kind}{suffix} not drawn: {str(exc).splitlines()[0][:160]}")
    stamp.write_text(told)
    return saved


def finish(spec: SweepSpec, study: optuna.Study, session: Session | None, *,
           runner: TrialRunner | None = None, say: Say = print) -> SweepReport:
    """Draw the plots, mark the best trials' runs (a history event, best.json beside the study, their
    model fetched here by the runner), and say what the sweep did."""
    plots = save_plots(study, spec.folder / "plots", say)
    best = best_numbers(study)
    found = rows(study)
    marked = []
    for row in found:
        if row.number not in best:
            continue
        model = runner.model_of(row.run) if runner is not None else None
        marked.append({"run": row.run, "trial": row.number, "values": row.values, "params": row.params,
                       "model": str(model) if model else None})
        if session is not None:
            with contextlib.suppress(errors.ForjaError):
                session.history.record_event(row.run, "sweep_best", sweep=spec.name, values=row.values,
                                             model=str(model) if model else None)
    if marked:
        (spec.folder / "best.json").write_text(json.dumps(marked, indent=1))
        for entry in marked:
            where = f"; its model: {entry['model']}" if entry["model"] else ""
            say(f"best: {entry['run']} {entry['params']} -> {entry['values']}{where}")
    return report_of(spec, found, plots)


def report_of(spec: SweepSpec, found: list[TrialRow], plots: list[str]) -> SweepReport:
    """The sweep's report from its trials' rows: what it spent as --max-usd counts it, and how many
    trials that counts at the trainer's own figure (a floor: not settled yet)."""
    return SweepReport(spec.name, list(spec.metrics), list(spec.directions), found,
                       [r.run for r in found if r.best], _spent(found),
                       spec.driven_s, spec.stopped, plots, str(spec.folder),
                       unsettled=sum(r.cost_usd is None and r.training_usd is not None for r in found))


# -- the verbs -------------------------------------------------------------------------------------
def sweep(
    session: Session,
    config: str | Path,
    *,
    space: str | Path,
    trials: int,
    parallel: int = 1,
    name: str | None = None,
    metrics: Sequence[str] = (),
    directions: Sequence[str] = (),
    max_usd: float | None = None,
    max_hours: float | None = None,
    project: str | Path | None = None,
    prune: bool = True,
    local: bool = False,
    first: Sequence[Mapping[str, Any]] = (),
    fallback_zones: Sequence[str] = (),
    budget: managed.RecoveryBudget | None = None,
    poll_s: float = POLL_S,
    say: Say = print,
) -> SweepReport:
    """Search hyperparameters with Optuna: `trials` runs of `config`, each with values from `space`.

    `space` is a YAML file of the config's keys (dotted for nested ones) and Optuna's distributions:
    `lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}`, `type: int` (with `step`), or
    `type: categorical` with `choices`; `objectives:` (or `metrics`/`directions`, e.g. eval_loss and
    cost_usd both minimized) say what a trial is judged by: fields of the run's summary (default
    eval_loss, minimized). Each trial is an ordinary run named NAME-tNNN, sent with the config plus
    its values, with its own checkpoints, live metrics and cost. `parallel` trials run at once: one per
    GPU, into the VM's run queue when forja has one, else one per VM of the inventory (or of the
    session's cluster); more than there are GPUs is refused. A trial whose metric lines fall behind
    the others' at the same step is pruned (stopped through forja, told PRUNED). A preempted one
    resumes from its own checkpoint as a `train_managed` run does: its VM is started again by a
    managed watcher, or, when the VM is gone or its zone has no capacity, made again in the next of
    `fallback_zones` with its trials sent again (resuming from the bucket's checkpoints); `budget`
    (`forja.managed.RecoveryBudget`) bounds each trial's recoveries and each VM's time and money down.
    One that cannot finish is told FAIL with why. `max_usd` (the trials' costs: each its run's,
    settled as it ends, as `forja runs` shows it; a trial not settled yet at the trainer's own count so
    far, a floor) and `max_hours` stop new trials when reached. `local` runs the trials as trainer
    processes on this machine instead (a CPU-sized sweep). `first` are values to try before the
    sampler's own (e.g. the config's, `[{"lr": 0.002}]`; Optuna's enqueue_trial).

    The study is SQLite in forja's home (sweeps/NAME/), copied to gs://BUCKET/sweeps/NAME/ after each
    trial ends when the inventory has a bucket; `resume` picks it up after a laptop slept or died. At
    the end: plots (history, importances, parallel coordinates) as PNG in sweeps/NAME/plots/, the best
    trial marked (best.json, its history), and a `SweepReport`. Example:
    `forja sweep trainer/configs/digits.yaml --space examples/sweep/space.yaml --trials 8`.
    """
    from forja import sweep_runners

    config_path = Path(config).expanduser().resolve()
    if not config_path.is_file():
        raise errors.ConfigError("config", f"{config} is not a file; give a trainer config YAML")
    from forja import trainer_config

    trainer_config.judge(config_path)
    space_path = Path(space).expanduser().resolve()
    chosen = sweep_space.load(space_path, config_path, metrics=metrics, directions=directions)
    _check_numbers(trials, parallel, max_usd, max_hours)
    budget = budget or managed.RecoveryBudget()
    budget.check()
    if fallback_zones and local:
        raise errors.ConfigError("--fallback-zone", "--local trials run on this machine, which no zone "
                                 "takes away; drop --fallback-zone, or --local to run them on the VMs")
    sweep_name = checked_sweep_name(name or default_name(config_path))
    # the user's config decides the project (its git root...), never the trial configs kept under forja's home
    project_dir = session.project_folder(project, config_path)
    runner = sweep_runners.for_session(session, local=local, parallel=parallel, project=project_dir,
                                       name=sweep_name, fallback_zones=fallback_zones,
                                       budget=vm_budget(budget, trials), say=say)
    gpus = runner.slots()
    if parallel > gpus:
        raise errors.ConfigError(
            "--parallel", f"{parallel} trials at once, and {runner.describe()} has {gpus} GPU"
            f"{'s' if gpus != 1 else ''} (one trial per GPU); use --parallel {gpus}, or a cluster with more "
            "VMs (--cluster NAME)")
    _refuse_used_name(session, sweep_name)
    spec = SweepSpec(
        name=sweep_name, config=str(config_path), space=str(space_path), trials=trials, parallel=parallel,
        metrics=[o.metric for o in chosen.objectives], directions=[o.direction for o in chosen.objectives],
        max_usd=max_usd, max_hours=max_hours, cluster=session.cluster,
        project=str(project_dir) if project_dir else None, where="local" if local else "vm", prune=prune,
        fallback_zones=list(dict.fromkeys(fallback_zones)), max_recoveries=budget.max_recoveries,
        max_down_s=budget.max_down_s, max_down_usd=budget.max_down_usd,
    )
    study = open_study(spec, create=True)
    shutil.copyfile(config_path, spec.config_copy)
    shutil.copyfile(space_path, spec.space_copy)
    for values in first:
        study.enqueue_trial(dict(values))
    spec.save()
    say(f"sweep {sweep_name}: {trials} trials of {config_path.name}, {parallel} at once on "
        f"{runner.describe()}; study {spec.folder / 'study.db'}")
    return Driver(spec, study, runner, session=session, poll_s=poll_s, say=say).run()


def resume(session: Session, name: str, *, project: str | Path | None = None, poll_s: float = POLL_S,
           say: Say = print) -> SweepReport:
    """Go on with a sweep after its controller stopped (a laptop that slept, died or was closed):
    its trials still running are watched again, those that ended meanwhile are told, and new ones
    are sent until its trials or budget are used. The study is read here, else from the bucket
    (gs://BUCKET/sweeps/NAME/), so another machine can take it over (`project`: where the project
    sent with each trial is on this machine, when not where the sweep started). Example: `forja sweep resume
    digits-sweep-1130-1244`."""
    from forja import sweep_runners

    checked_sweep_name(name)
    spec = SweepSpec.load(name) or (None if session.inventory is None else restore(session, name))
    if spec is None:
        raise errors.ConfigError("name", f"no sweep {name!r} here ({SweepSpec.folder_of(name)}) nor in the "
                                 "inventory's bucket; `forja sweep status` lists the sweeps")
    if spec.cluster and session.cluster is None:
        session.cluster = spec.cluster
    spec.stopped = None  # each reason is judged again: a budget still spent stops it at once
    if project is not None:
        spec.project = str(session.project_folder(project))
    runner = sweep_runners.for_session(session, local=spec.where == "local", parallel=spec.parallel,
                                       project=Path(spec.project) if spec.project else None, name=spec.name,
                                       fallback_zones=spec.fallback_zones, budget=spec.vm_budget(), say=say)
    study = open_study(spec, create=False)
    say(f"sweep {name}: resuming ({len(study.trials)} of {spec.trials} trials asked)")
    return Driver(spec, study, runner, session=session, poll_s=poll_s, say=say).run()


def status(session: Session, name: str | None = None) -> list[SweepReport]:
    """The sweeps kept here (newest first), or one: each trial's run, parameters, value, state, cost
    (its run's, settled at its end; else the trainer's count so far, a floor) and time, the best
    marked. Reads the studies only: no host is asked."""
    root = forja_home() / "sweeps"
    if name is not None:
        spec = SweepSpec.load(checked_sweep_name(name))
        if spec is None:
            raise errors.ConfigError("name", f"no sweep {name!r} here ({root}); `forja sweep status` "
                                     "lists them")
        specs = [spec]
    else:
        found = [SweepSpec.load(p.name) for p in root.iterdir()
                 if (p / "sweep.json").is_file()] if root.is_dir() else []
        specs = sorted((s for s in found if s is not None), key=lambda s: s.created_at, reverse=True)
    reports = []
    for spec in specs:
        study = open_study(spec, create=False)
        plots = sorted(str(p) for p in (spec.folder / "plots").glob("*.png"))
        reports.append(report_of(spec, rows(study), plots))
    return reports


def params_of(row: TrialRow | Mapping[str, Any]) -> str:
    params = row.params if isinstance(row, TrialRow) else row.get("params", {})
    return ", ".join(f"{k}={_shown(v)}" for k, v in params.items())
