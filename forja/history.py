"""Run history: every training run in a local SQLite database, including the ones that stopped.

A run is recorded *before* its playbook starts (status "running"), so a controller crash,
a preempted VM or a failed play leaves a row that says so instead of nothing. Later writes
only update that row (`update`) or add to its event log (`record_event`); the cost guard
records preemptions the same way.

A row's status comes only from what a host reported (or from forja giving up on a play, or the
managed watcher bringing a preempted run's VM back: BACK_EVENTS), never from elapsed time, so it
stays true for runs of days. Runs that forja did not start (site.yml, `ansible-playbook
playbooks/train.yml`, another controller) are added from the host's own state by `record_host_run`:
the train playbook calls `python -m forja.record` on the controller, and `forja status` adds every
run a host reports.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forja import runstate
from forja.errors import ConfigError, RunNotFound
from forja.paths import forja_home
from trainer.summary import Summary

#: Statuses a run can have. "running" until the play (or a later status/fetch) says otherwise.
STATUSES = ("queued", "running", "completed", "preempted", "diverged", "failed", "cancelled", "stopped",
            "unknown")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id       TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    hosts        TEXT NOT NULL DEFAULT '[]',
    config_path  TEXT,
    config_hash  TEXT,
    status       TEXT NOT NULL DEFAULT 'running',
    started_at   TEXT NOT NULL,
    ended_at     TEXT,
    steps        INTEGER,
    last_loss    REAL,
    cost_usd     REAL,  -- the run's cost (forja/cost/run.py): so far while it runs, settled at its end
    artifact_dir TEXT,
    preemptions  INTEGER NOT NULL DEFAULT 0,
    lost_steps   INTEGER NOT NULL DEFAULT 0,
    message      TEXT
);
CREATE TABLE IF NOT EXISTS run_events (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    time   TEXT NOT NULL,
    kind   TEXT NOT NULL,
    data   TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS run_events_run ON run_events(run_id);
"""

#: Events the managed watcher records when it brought a run's VM back: started again in its zone, or made
#: again in another and the run sent again (forja/managed.py). The run goes on from its checkpoint.
BACK_EVENTS = ("restarted", "zone_moved")

#: Columns `update` may set (run_id and started_at never change).
UPDATABLE = (
    "name", "hosts", "config_path", "config_hash", "status", "ended_at", "steps", "last_loss",
    "cost_usd", "artifact_dir", "preemptions", "lost_steps", "message",
)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RunRecord:
    """One row of the history."""

    run_id: str
    name: str
    hosts: list[str]
    config_path: str | None
    config_hash: str | None
    status: str
    started_at: str
    ended_at: str | None
    steps: int | None
    last_loss: float | None
    cost_usd: float | None
    artifact_dir: str | None
    preemptions: int
    lost_steps: int
    message: str | None


@dataclass(frozen=True)
class RunEvent:
    run_id: str
    time: str
    kind: str
    data: dict[str, Any]


def default_path() -> Path:
    return forja_home() / "history.sqlite"


class History:
    """The SQLite history (one file, safe for a few processes: WAL mode, short transactions)."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._connect() as db:
            db.executescript(SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.row_factory = sqlite3.Row
            with db:
                yield db
        finally:
            db.close()

    def start(
        self,
        run_id: str,
        *,
        name: str,
        hosts: Sequence[str] = (),
        config_path: str | None = None,
        config_hash: str | None = None,
        artifact_dir: str | None = None,
    ) -> RunRecord:
        """Record a run that is about to start (status "running").

        An id already in the history is either the same run sent again while it has not ended (it
        keeps its first start) or, once that run has ended, a new run under the same name: it
        starts now, and the old run's results, preemptions and end are cleared from the row.
        """
        with self._lock, self._connect() as db:
            row = db.execute("SELECT ended_at FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is not None and row["ended_at"] is None:  # the same run again: its first start stands
                db.execute(
                    "UPDATE runs SET name = ?, hosts = ?, config_path = ?, config_hash = ?,"
                    " status = 'running', artifact_dir = ? WHERE run_id = ?",
                    (name, json.dumps(list(hosts)), config_path, config_hash, artifact_dir, run_id),
                )
            else:
                db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))  # an ended run: a new one now
                db.execute(
                    "INSERT INTO runs (run_id, name, hosts, config_path, config_hash, status, started_at,"
                    " artifact_dir) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)",
                    (run_id, name, json.dumps(list(hosts)), config_path, config_hash, now(), artifact_dir),
                )
            db.execute(
                "INSERT INTO run_events (run_id, time, kind, data) VALUES (?, ?, 'started', '{}')",
                (run_id, now()),
            )
        return self.get(run_id)

    def rename(self, run_id: str, new_id: str) -> RunRecord:
        """Give a run, with its events, another id (and name): `forja train --replace` keeps the run it
        replaces this way, so the new run under the old name starts with none of its events while
        `forja runs`, `forja cost --run` and the dashboard still show what the old one did and cost."""
        with self._lock, self._connect() as db:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (new_id,)).fetchone() is not None:
                raise ConfigError("name", f"run {new_id!r} is already in the history ({self.path})")
            cur = db.execute("UPDATE runs SET run_id = ?, name = ? WHERE run_id = ?",
                             (new_id, new_id, run_id))
            if cur.rowcount == 0:
                raise RunNotFound(f"run {run_id!r} is not in the history ({self.path})")
            db.execute("UPDATE run_events SET run_id = ? WHERE run_id = ?", (new_id, run_id))
        return self.get(new_id)

    def drop(self, run_id: str) -> None:
        """Remove a run and its events: a run that was refused before anything was sent (`--replace`
        undoing itself when the play refused the replacement)."""
        with self._lock, self._connect() as db:
            db.execute("DELETE FROM run_events WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))

    def update(self, run_id: str, **fields: Any) -> RunRecord:
        """Set some columns of a run; unknown columns or statuses are an error naming them."""
        unknown = sorted(set(fields) - set(UPDATABLE))
        if unknown:
            raise ConfigError(", ".join(unknown), f"not a history column; use one of {', '.join(UPDATABLE)}")
        if "status" in fields and fields["status"] not in STATUSES:
            raise ConfigError("status", f"{fields['status']!r} is not one of {', '.join(STATUSES)}")
        if "hosts" in fields:
            fields["hosts"] = json.dumps(list(fields["hosts"]))
        if fields:
            cols = ", ".join(f"{k} = ?" for k in fields)
            with self._lock, self._connect() as db:
                cur = db.execute(f"UPDATE runs SET {cols} WHERE run_id = ?", (*fields.values(), run_id))
                if cur.rowcount == 0:
                    raise RunNotFound(f"run {run_id!r} is not in the history ({self.path})")
        return self.get(run_id)

    def record_event(self, run_id: str, kind: str, **data: Any) -> None:
        """Append to a run's event log; kind "preempted" also counts a preemption and adds lost_steps.

        A BACK_EVENTS kind reopens a run recorded as ended "preempted" (a look at its host between the
        Spot notice and the VM going down, `forja status` or the watcher's own): it is running again,
        with no end, so its end is where it really ends and its cost (settled there, forja.cost_report)
        covers every boot, less the time down the watcher counted, not only the part up to the
        preemption; and a zone move's send finds it still going, so it keeps its first start
        (`start`). The ``settled`` event of that interim end stays in its log."""
        with self._lock, self._connect() as db:
            if db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
                raise RunNotFound(f"run {run_id!r} is not in the history ({self.path})")
            db.execute(
                "INSERT INTO run_events (run_id, time, kind, data) VALUES (?, ?, ?, ?)",
                (run_id, now(), kind, json.dumps(data, default=str)),
            )
            if kind == "preempted":
                db.execute(
                    "UPDATE runs SET preemptions = preemptions + 1, lost_steps = lost_steps + ?"
                    " WHERE run_id = ?",
                    (int(data.get("lost_steps") or 0), run_id),
                )
            elif kind in BACK_EVENTS:
                db.execute("UPDATE runs SET status = 'running', ended_at = NULL"
                           " WHERE run_id = ? AND status = 'preempted'", (run_id,))

    def record_host_run(
        self,
        state: runstate.RunState,
        *,
        hosts: Sequence[str],
        config_path: str | None = None,
        message: str | None = None,
    ) -> bool:
        """Add or bring up to date a run as its rank-0 host reports it; True when a row changed.

        A run missing from the history (started by site.yml or another controller) is added with
        the host's setup time as its start. A known run keeps its first start and only takes the
        host's status when that is final (a "running" host never overwrites what forja decided,
        e.g. "cancelled"). A host that set the run up after the recorded run ended holds a new run
        under the same name: it replaces the row, starting at the host's setup time.
        """
        fields: dict[str, Any] = {"status": state.status if state.status in STATUSES else "unknown"}
        fields.update(summary_fields(state.summary or {}))
        if state.final and (state.queue or {}).get("reason"):  # failed out of its host's queue: why
            fields["message"] = f"queue: {state.queue['reason']}"
        try:
            record = self.get(state.run)
        except RunNotFound:
            record = None
        if record is not None and _set_up_after(state, record.ended_at):
            with self._lock, self._connect() as db:
                db.execute("DELETE FROM runs WHERE run_id = ?", (state.run,))
            record = None
        if record is None:
            with self._lock, self._connect() as db:
                db.execute(
                    "INSERT OR IGNORE INTO runs (run_id, name, hosts, config_path, status, started_at,"
                    " message) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (state.run, state.run, json.dumps(list(hosts)), config_path, fields["status"],
                     state.configured_at or now(), message),
                )
                db.execute(
                    "INSERT INTO run_events (run_id, time, kind, data) VALUES (?, ?, 'discovered', ?)",
                    (state.run, now(), json.dumps({"hosts": list(hosts), "status": fields["status"]})),
                )
            record = self.get(state.run)
            changed = True
        else:
            changed = False
        if not state.final:
            if record.status == "queued" and state.status == "running":  # the host's queue started it
                self.update(state.run, status="running")
                self.record_event(state.run, "admitted", waited_s=(state.queue or {}).get("waited_s"))
                changed = True
            return changed
        current = {k: getattr(record, k) for k in fields}
        if current != fields or record.ended_at is None:
            self.update(state.run, **fields, ended_at=record.ended_at or now())
            changed = True
        return changed

    def events(self, run_id: str) -> list[RunEvent]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT run_id, time, kind, data FROM run_events WHERE run_id = ? ORDER BY id", (run_id,)
            ).fetchall()
        return [RunEvent(r["run_id"], r["time"], r["kind"], json.loads(r["data"])) for r in rows]

    def get(self, run_id: str) -> RunRecord:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"run {run_id!r} is not in the history ({self.path})")
        return _record(row)

    def find(self, name_or_id: str) -> RunRecord:
        """A run by id, or the newest run with that name."""
        with self._connect() as db:
            row = db.execute(
                "SELECT * FROM runs WHERE run_id = ? OR name = ?"
                " ORDER BY started_at DESC, rowid DESC LIMIT 1",
                (name_or_id, name_or_id),
            ).fetchone()
        if row is None:
            raise RunNotFound(f"no run called {name_or_id!r} in the history ({self.path}); see `forja runs`")
        return _record(row)

    def list(self, limit: int = 50, status: str | None = None) -> list[RunRecord]:
        """Newest first."""
        if status is not None and status not in STATUSES:
            raise ConfigError("status", f"{status!r} is not one of {', '.join(STATUSES)}")
        query = "SELECT * FROM runs"
        args: list[Any] = []
        if status:
            query += " WHERE status = ?"
            args.append(status)
        query += " ORDER BY started_at DESC, rowid DESC LIMIT ?"
        args.append(int(limit))
        with self._connect() as db:
            rows = db.execute(query, args).fetchall()
        return [_record(r) for r in rows]


def _set_up_after(state: runstate.RunState, ended_at: str | None) -> bool:
    """Whether the host set this run up after the recorded run with its name ended (a new run)."""
    if not ended_at or not state.configured_at:
        return False
    from forja.cost.spend import parse_time

    try:
        return parse_time(state.configured_at) > parse_time(ended_at)
    except ValueError:
        return False


def summary_fields(summary: Mapping[str, Any]) -> dict[str, Any]:
    """History columns from a trainer summary (summary.json): steps, loss, preemptions.

    Not its ``cost_usd``: that is the trainer's own count (its processes' wall time at the rate), a part
    of the run's cost; the history's ``cost_usd`` is the run's cost, which forja.cost_report.settle
    writes once the run has ended (forja/cost/run.py says why they differ).
    Read through the trainer's own field list (trainer.summary), so a renamed field fails here loudly."""
    read = Summary.from_dict(summary)
    columns = {"steps": (read.steps, int), "last_loss": (read.final_loss, float),
               "lost_steps": (read.lost_steps, int), "preemptions": (read.preemptions, int)}  # fmt: skip
    return {col: kind(value) for col, (value, kind) in columns.items() if isinstance(value, int | float)}


def _record(row: sqlite3.Row) -> RunRecord:
    """A row as its record: the columns named as the fields (SELECT * may hold more), hosts as a list."""
    fields = {name: row[name] for name in RunRecord.__dataclass_fields__}
    return RunRecord(**{**fields, "hosts": json.loads(row["hosts"] or "[]")})

