"""A thin typed facade over ansible-runner: one request type in, one result type out.

Why a facade: ansible-runner's defaults are wrong for us in quiet ways (it turns SSH host-key
checking off unless told otherwise, drops events when the handler does not return True, writes
extra vars onto the command line and into `env/` files, keeps every artifact folder forever, and
points the fact cache into each run's artifacts). Every runner argument is decided here, once:

- `private_data_dir` is absolute (runner issue #1038), `project_dir` is forja's content (the clone,
  or the copy an installed wheel carries: forja.paths) so its `ansible.cfg`, roles and plugins apply,
  with `forja.paths.ansible_env` naming them to Ansible where no clone's link does;
- host-key checking is an explicit choice of the caller, passed as ANSIBLE_HOST_KEY_CHECKING;
- extra vars go through a 0600 file that is deleted after the run, never the command line, and
  `suppress_env_files` keeps runner from writing `env/extravars`;
- artifacts are rotated; the fact cache stays the one ansible.cfg configures.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from forja import errors
from forja.inventory import STRICT_INVENTORY, unparsed
from forja.paths import REPO_ROOT, ansible_env, forja_home

if TYPE_CHECKING:
    from forja import events as ev

# ansible_runner and forja.events are imported where a play runs, not here: a process that only reads
# results (a role's `python -m forja.record`) should not pay for them at start-up.

log = logging.getLogger(__name__)
logging.getLogger("ansible-runner").addHandler(logging.NullHandler())

#: Finished artifact folders kept per private data dir; older ones are deleted (`rotate_artifacts`).
KEEP_ARTIFACTS = 20

EventT = TypeVar("EventT")
ResultT = TypeVar("ResultT")


@dataclass(frozen=True, kw_only=True)
class PlaybookRun:
    """One playbook run, fully described.

    Args:
        playbook: a file under the repository's playbooks/ ("train.yml") or an absolute path.
        inventory: inventory path(s); None uses ansible.cfg's.
        extravars: variables for the play; may hold secrets, they never reach a command line.
        limit: Ansible host pattern to restrict the run.
        host_key_checking: verify SSH host keys; the caller must choose (sandbox/tests say False).
        timeout_s: cancel the run after this many seconds (None: no limit).
        private_data_dir: runner's working folder; None is <forja home>/runner.
        verbosity: -v count.
    """

    playbook: str
    inventory: str | list[str] | None = None
    extravars: Mapping[str, Any] = field(default_factory=dict)
    limit: str | None = None
    host_key_checking: bool = True
    timeout_s: int | None = None
    private_data_dir: Path | None = None
    verbosity: int = 0

    def playbook_path(self) -> Path:
        path = Path(self.playbook)
        if not path.is_absolute():
            path = REPO_ROOT / "playbooks" / path
        if not path.is_file():
            raise errors.ConfigError("playbook", f"{path} does not exist")
        return path


@dataclass(frozen=True)
class HostStats:
    """Per-host counts from the play recap (`unreachable` is runner's `dark`)."""

    ok: int = 0
    changed: int = 0
    failures: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass(frozen=True)
class TaskOutcome:
    """A task that changed or failed something on one host."""

    host: str
    task: str
    action: str = ""
    message: str = ""
    error_code: str = ""


@dataclass(frozen=True)
class RunResult:
    """What a playbook run did. `status` is runner's: successful, failed, canceled or timeout."""

    playbook: str
    status: str
    rc: int
    stats: dict[str, HostStats]
    changed_tasks: list[TaskOutcome]
    failed_tasks: list[TaskOutcome]
    unreachable: list[TaskOutcome]
    duration_s: float
    artifact_dir: Path | None
    events: list[ev.Event] = field(default_factory=list, repr=False, compare=False)
    #: What the roles published with set_stats (ansible-runner's artifact data): forja's typed contract.
    artifact_data: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: The last lines ansible-playbook printed, when it failed before any task could (a playbook it
    #: cannot parse, a missing role): the cause, in Ansible's own words.
    output_tail: str = field(default="", repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0

    def raise_for_status(self) -> RunResult:
        """Raise the typed error that explains a failed run; return self when it succeeded."""
        if self.status in ("canceled", "timeout"):
            how = "timed out" if self.status == "timeout" else "cancelled"
            raise errors.Cancelled(f"{self.playbook} was {how}")
        if self.unreachable:
            first = self.unreachable[0]
            raise errors.HostUnreachable(first.host, first.message, task=first.task)
        if self.failed_tasks:
            first = self.failed_tasks[0]
            raise errors.PlaybookFailed(
                first.host, first.task, first.message, playbook=self.playbook, code=first.error_code
            )
        if not self.ok:  # no task failed: the cause is what Ansible said, then how it ended
            not_parsed = unparsed(self.output_tail)  # the inventory's own words, not every plugin's
            if not_parsed is not None:
                raise not_parsed
            why = f"ansible-playbook exited with {self.rc}"
            where = f"; its output is in {self.artifact_dir / 'stdout'}" if self.artifact_dir else ""
            said = f"{self.output_tail} ({why})" if self.output_tail else f"{why} and said nothing{where}"
            raise errors.PlaybookFailed("", "", said, playbook=self.playbook)
        return self


class _Collector:
    """Turns runner event dicts into typed events, feeds the caller, and remembers what failed."""

    def __init__(self, on_event: Callable[[ev.Event], None] | None) -> None:
        self.on_event = on_event
        self.events: list[ev.Event] = []
        self.stats: dict[str, dict[str, int]] = {}
        self.artifact_data: dict[str, Any] = {}
        self.lock = threading.Lock()

    def __call__(self, raw: dict[str, Any]) -> bool:
        from forja import events as ev

        for event in ev.from_runner(raw):
            with self.lock:
                self.events.append(event)
                if isinstance(event, ev.PlaybookFinished):
                    self.stats = event.stats
                    self.artifact_data = event.artifact_data
            if self.on_event is not None:
                try:
                    self.on_event(event)
                except Exception:  # a broken UI callback must not kill the run
                    log.exception("event callback failed")
        return True  # False would make ansible-runner drop the event (runner PR #463)


def _result(request: PlaybookRun, runner: Any, collector: _Collector, started: float) -> RunResult:
    from forja import events as ev

    stats: dict[str, HostStats] = {}
    raw = collector.stats
    hosts = set().union(*(raw.get(k, {}).keys() for k in raw)) if raw else set()
    for host in sorted(hosts):
        stats[host] = HostStats(
            ok=raw.get("ok", {}).get(host, 0),
            changed=raw.get("changed", {}).get(host, 0),
            failures=raw.get("failures", {}).get(host, 0),
            unreachable=raw.get("dark", {}).get(host, 0),
            skipped=raw.get("skipped", {}).get(host, 0),
            rescued=raw.get("rescued", {}).get(host, 0),
            ignored=raw.get("ignored", {}).get(host, 0),
        )
    changed: list[TaskOutcome] = []
    failed: list[TaskOutcome] = []
    unreachable: list[TaskOutcome] = []
    for e in collector.events:
        if isinstance(e, ev.TaskChanged):
            changed.append(TaskOutcome(e.host, e.task, e.action))
        elif isinstance(e, ev.TaskFailed) and not e.ignored:
            failed.append(TaskOutcome(e.host, e.task, e.action, e.message, e.error_code))
        elif isinstance(e, ev.HostUnreachable):
            unreachable.append(TaskOutcome(e.host, e.task, "", e.message))
    artifact = Path(runner.config.artifact_dir) if getattr(runner, "config", None) else None
    rc = int(runner.rc if runner.rc is not None else -1)
    tail = _output_tail(artifact) if rc != 0 and not failed and not unreachable else ""
    return RunResult(
        playbook=Path(request.playbook).name,
        status=str(runner.status),
        rc=rc,
        stats=stats,
        changed_tasks=changed,
        failed_tasks=failed,
        unreachable=unreachable,
        duration_s=round(time.monotonic() - started, 3),
        artifact_dir=artifact,
        events=list(collector.events),
        artifact_data=dict(collector.artifact_data),
        output_tail=tail,
    )


def _output_tail(artifact: Path | None, lines: int = 6) -> str:
    """Ansible's own error from the run's stdout (artifacts/<ident>/stdout): its ERROR lines (without
    the `[ERROR]:` mark), with every plugin's reason when an inventory could not be parsed (the one of
    the plugin that owns the file is the cause: an emulator down, a key refused; see
    forja.inventory.unparsed), else its last lines; one line."""
    try:
        text = (artifact / "stdout").read_text(errors="replace") if artifact else ""
    except OSError:
        return ""
    said = [line.strip() for line in text.splitlines() if line.strip()]
    errors_said = [line for line in said if line.startswith(("ERROR!", "[ERROR]"))][:2]
    if not errors_said:
        return " ".join(said[-lines:])[:800]
    # every plugin's reason: forja.inventory.unparsed picks the one of the plugin that owns the file
    causes = list(dict.fromkeys(line.removeprefix("[WARNING]: ") for line in said
                                if line.startswith("[WARNING]: Failed to parse inventory with")))
    if causes:
        return " ".join(errors_said + causes)[:4000]
    return " ".join(line.removeprefix("[ERROR]: ").removeprefix("ERROR! ") for line in errors_said)[:800]


def _tools_path() -> dict[str, str]:
    """PATH with the folder of forja's own Python first when ansible-playbook lives there and PATH
    lacks it: `.venv/bin/forja` run without activating the venv then runs the venv's Ansible (and
    its plays the venv's tools), not a missing or a system one."""
    tools = Path(sys.executable).parent
    path = os.environ.get("PATH", "")
    if not (tools / "ansible-playbook").exists() or str(tools) in path.split(os.pathsep):
        return {}
    return {"PATH": os.pathsep.join([str(tools), path]) if path else str(tools)}


def _runner_kwargs(request: PlaybookRun, extravars_file: Path | None, ident: str) -> dict[str, Any]:
    """Every argument ansible-runner gets, decided in one place."""
    data_dir = (request.private_data_dir or forja_home() / "runner").resolve()
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    envvars = {
        "ANSIBLE_HOST_KEY_CHECKING": "True" if request.host_key_checking else "False",
        "ANSIBLE_FORCE_COLOR": "False",
        "ANSIBLE_NOCOLOR": "True",
        **STRICT_INVENTORY,
        **_tools_path(),
        **ansible_env(),
    }
    kwargs: dict[str, Any] = {
        "private_data_dir": str(data_dir),
        "project_dir": str(REPO_ROOT),
        "playbook": str(request.playbook_path()),
        "ident": ident,
        "envvars": envvars,
        "suppress_env_files": True,
        # Not ansible-runner's rotation: it deletes the oldest folders by age alone, so a long play
        # (a configure) is deleted under its own feet while a watcher's short polls pile up beside
        # it. rotate_artifacts() below spares every folder of a play still running.
        "rotate_artifacts": 0,
        "quiet": True,
        "json_mode": False,
        "fact_cache_type": "",  # keep ansible.cfg's fact cache instead of a per-run one
        # How often runner looks at the cancel callback: a Ctrl-C that detaches answers within a second.
        "settings": {"pexpect_timeout": 1},
        "verbosity": request.verbosity or None,
    }
    if request.inventory:
        inv = request.inventory
        paths = [str(Path(i).resolve()) for i in (inv if isinstance(inv, list) else [inv])]
        kwargs["inventory"] = paths if isinstance(inv, list) else paths[0]
    if request.limit:
        kwargs["limit"] = request.limit
    if extravars_file is not None:
        kwargs["cmdline"] = f"-e @{extravars_file}"
    if request.timeout_s:
        kwargs["timeout"] = int(request.timeout_s)
    return kwargs


class _ExtravarsFile:
    """Extra vars in a 0600 file inside a 0700 folder, removed afterwards: never on a command line."""

    def __init__(self, extravars: Mapping[str, Any]) -> None:
        self.extravars = dict(extravars)
        self.path: Path | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def __enter__(self) -> Path | None:
        if not self.extravars:
            return None
        self._dir = tempfile.TemporaryDirectory(prefix="forja-vars-")
        path = Path(self._dir.name) / "extravars.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.extravars, fh, default=str)
        self.path = path
        return path

    def __exit__(self, *exc: object) -> None:
        if self._dir is not None:
            self._dir.cleanup()


def run(
    request: PlaybookRun,
    on_event: Callable[[ev.Event], None] | None = None,
    cancel: Callable[[], bool] | threading.Event | None = None,
) -> RunResult:
    """Run a playbook to the end and return what it did (never raises for a failed play: see
    `RunResult.raise_for_status`). `cancel` is polled by runner; when it says True the run stops
    and the result's status is "canceled"."""
    collector = _Collector(on_event)
    ident = f"{time.strftime('%Y%m%dT%H%M%S')}-{Path(request.playbook).stem}-{uuid.uuid4().hex[:6]}"
    if isinstance(cancel, threading.Event):
        cancel_event = cancel

        def cancel_cb() -> bool:
            return cancel_event.is_set()
    elif cancel is not None:
        cancel_cb = cancel
    else:

        def cancel_cb() -> bool:
            return False

    import ansible_runner

    started = time.monotonic()
    with _ExtravarsFile(request.extravars) as vars_file:
        kwargs = _runner_kwargs(request, vars_file, ident)
        runner = ansible_runner.run(event_handler=collector, cancel_callback=cancel_cb, **kwargs)
    result = _result(request, runner, collector, started)
    rotate_artifacts(Path(kwargs["private_data_dir"]) / "artifacts", KEEP_ARTIFACTS)
    return result


def rotate_artifacts(folder: Path, keep: int) -> None:
    """Delete all but the `keep` newest artifact folders of finished plays.

    A play is finished once ansible-runner wrote its `status` file; a folder without one belongs to
    a play still running (in this process or another) and is never touched.
    """
    finished = []
    for path in folder.glob("*/status"):
        with contextlib.suppress(OSError):
            finished.append((path.stat().st_mtime, path.parent))
    for _, stale in sorted(finished, reverse=True)[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


class Stream(Generic[EventT, ResultT]):
    """One call running in its own thread: iterate its events as they happen, then its result last.

    The one event primitive of forja: `iter_events` here (one playbook) and `Forja.iter_events`
    (any API call) are both a Stream. `work(emit, cancelled)` runs in the thread; it hands each
    event to `emit` and should stop soon after `cancelled` is set. Every Stream has its own cancel
    token, so two calls never cancel each other: `cancel()` (from any thread) or leaving the loop
    early (`break`, `close()`) stops this call only. An exception of the call is raised to the
    loop that iterates it.
    """

    def __init__(self, work: Callable[[Callable[[EventT], None], threading.Event], ResultT],
                 name: str = "forja-call") -> None:
        self.cancelled = threading.Event()
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._thread = threading.Thread(target=self._work, args=(work,), name=name, daemon=True)
        self._thread.start()

    def _work(self, work: Callable[[Callable[[EventT], None], threading.Event], ResultT]) -> None:
        try:
            self._queue.put(("done", work(self._emit, self.cancelled)))
        except BaseException as exc:  # handed to the consumer
            self._queue.put(("error", exc))

    def _emit(self, event: EventT) -> None:
        self._queue.put(("event", event))

    def __iter__(self) -> Iterator[EventT | ResultT]:
        try:
            while True:
                kind, item = self._queue.get()
                if kind == "error":
                    raise item
                yield item
                if kind == "done":
                    return
        finally:
            self.close()

    def result(self) -> ResultT:
        """Wait for the call's end, dropping its events, and return what it returned."""
        last: Any = None
        for last in self:  # noqa: B007 - the result is the last item
            pass
        return last

    def cancel(self) -> None:
        """Ask this call to stop (it ends at its next look at the token: about a second for a playbook)."""
        self.cancelled.set()

    def close(self) -> None:
        """Cancel the call if it is still running and wait for its thread to end."""
        if self._thread.is_alive():
            self.cancel()
            self._thread.join()


def iter_events(request: PlaybookRun) -> Stream[ev.Event, RunResult]:
    """Yield typed events while the playbook runs, then its RunResult last (see `Stream`).

    The run happens in a thread; closing the iterator early (break) or `cancel()` cancels it.
    """
    return Stream(lambda emit, cancelled: run(request, on_event=emit, cancel=cancelled),
                  name=f"forja-{Path(request.playbook).stem}")
