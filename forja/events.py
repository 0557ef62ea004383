"""Typed events from ansible-runner's event dicts.

ansible-runner hands over "whatever Ansible emits" (runner issue #1243): nested dicts whose keys
change between event kinds. Callers of the forja API get small frozen dataclasses instead, built
in one place (`from_runner`), so a UI or a test matches on types, not on string keys.
Training progress is an event too: while a play follows a run, every poll of its state carries
a forja-train-state document (`forja.runstate`), which becomes a `TrainProgress`; a result that
carries an announcement key (`forja.contract.ANNOUNCEMENT_KEYS`) becomes an `Announcement`. Both
are recognised by what the result holds (forja/contract.py), never by the name of the task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from forja import contract, runstate


@dataclass(frozen=True)
class Event:
    """Base: the runner's counter (order) and the raw stdout line Ansible printed, if any."""

    counter: int
    stdout: str = field(default="", repr=False)


@dataclass(frozen=True)
class PlaybookStarted(Event):
    playbook: str = ""


@dataclass(frozen=True)
class PlayStarted(Event):
    play: str = ""


@dataclass(frozen=True)
class TaskStarted(Event):
    task: str = ""
    action: str = ""


@dataclass(frozen=True)
class TaskOk(Event):
    host: str = ""
    task: str = ""
    action: str = ""
    result: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class TaskChanged(TaskOk):
    """A task that changed something on a host (a subclass of TaskOk: it also succeeded)."""


@dataclass(frozen=True)
class TaskSkipped(Event):
    host: str = ""
    task: str = ""


@dataclass(frozen=True)
class TaskFailed(Event):
    host: str = ""
    task: str = ""
    action: str = ""
    message: str = ""
    ignored: bool = False
    #: The module's machine-readable error code, when it gives one (e.g. the Compute API's
    #: ZONE_RESOURCE_POOL_EXHAUSTED from gcp_gpu_instance): what a caller may act on.
    error_code: str = ""


@dataclass(frozen=True)
class HostUnreachable(Event):
    host: str = ""
    task: str = ""
    message: str = ""


@dataclass(frozen=True)
class TaskRetry(Event):
    host: str = ""
    task: str = ""
    attempt: int = 0
    retries: int = 0


@dataclass(frozen=True)
class TrainProgress(Event):
    """The newest metrics line of a run on one host, seen while the train play waits."""

    host: str = ""
    run: str = ""
    status: str = ""
    step: int = 0
    total_steps: int | None = None
    loss: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Announcement(Event):
    """A line a role wants people to see as it happens (what is sent, which PyTorch, the result)."""

    host: str = ""
    text: str = ""


@dataclass(frozen=True)
class HostStarting(Event):
    """A stopped VM that the call starts first (`Forja.tunnel(start=True)`), said before its play runs."""

    host: str = ""
    status: str = ""
    playbook: str = ""


@dataclass(frozen=True)
class PlaybookFinished(Event):
    """The recap; `artifact_data` is what the roles published with set_stats (the typed contract)."""

    playbook: str = ""
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    artifact_data: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def published(self) -> contract.Published:
        """What the roles published, typed (raises `contract.ContractError` when it cannot be read)."""
        return contract.read_stats(self.artifact_data)


def failed_item(res: dict[str, Any]) -> dict[str, Any] | None:
    """A looped task's first failed item (the gcp_instance role loops over a cluster's VMs): its
    own result carries the module's message and error code, the task's only Ansible's summary."""
    for item in res.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            return item
    return None


def failure_message(res: dict[str, Any]) -> str:
    """The most useful line of a failed result: msg, else stderr, else the module's exception."""
    if res.get("censored"):
        return str(res["censored"])
    item = failed_item(res)
    if item is not None:
        return failure_message(item)
    for key in ("msg", "stderr", "reason", "exception", "module_stderr", "stdout"):
        value = res.get(key)
        if value:
            text = str(value).strip()
            if key == "msg" and res.get("stderr") and "non-zero return code" in text:
                text = f"{text}: {str(res['stderr']).strip()}"
            return text[-2000:]
    results = res.get("results")
    if isinstance(results, list):
        for item in results:
            if isinstance(item, dict) and item.get("failed"):
                return failure_message(item)
    return "failed (no message from the module)"


def _progress(counter: int, stdout: str, host: str, res: dict[str, Any]) -> TrainProgress | None:
    """A TrainProgress when a task's stdout is one run's state document (a poll of the run)."""
    text = res.get("stdout")
    if not isinstance(text, str) or runstate.SCHEMA_KEY not in text:
        return None
    state = runstate.parse(text)
    if state is None:
        return None
    return TrainProgress(
        counter=counter,
        stdout=stdout,
        host=host,
        run=state.run,
        status=state.status,
        step=state.step or 0,
        total_steps=state.total_steps,
        loss=state.loss,
        metrics=dict(state.last or {}),
    )


def from_runner(raw: dict[str, Any]) -> list[Event]:
    """Typed events for one runner event dict (usually one; a poll of a run's state adds a TrainProgress)."""
    kind = raw.get("event", "")
    data = raw.get("event_data") or {}
    counter = int(raw.get("counter") or 0)
    stdout = raw.get("stdout") or ""
    host = data.get("host") or data.get("remote_addr") or ""
    task = (data.get("task") or "").strip()
    action = data.get("task_action") or data.get("resolved_action") or ""
    res = data.get("res") if isinstance(data.get("res"), dict) else {}

    if kind == "playbook_on_start":
        return [PlaybookStarted(counter, stdout, playbook=data.get("playbook", ""))]
    if kind == "playbook_on_play_start":
        return [PlayStarted(counter, stdout, play=data.get("play", data.get("name", "")))]
    if kind == "playbook_on_task_start":
        return [TaskStarted(counter, stdout, task=task, action=action)]
    if kind == "runner_on_ok":
        # no_log results are censored down to one key; Ansible's own line still says "changed:".
        changed = res.get("changed") if "changed" in res else stdout.strip().startswith("changed:")
        cls = TaskChanged if changed else TaskOk
        out: list[Event] = [cls(counter, stdout, host=host, task=task, action=action, result=res)]
        progress = _progress(counter, stdout, host, res)
        if progress:
            out.append(progress)
        text = contract.announcement(res)
        if text:
            out.append(Announcement(counter, stdout, host=host, text=text))
        return out
    if kind == "runner_on_skipped":
        return [TaskSkipped(counter, stdout, host=host, task=task)]
    if kind == "runner_on_failed":
        return [
            TaskFailed(
                counter,
                stdout,
                host=host,
                task=task,
                action=action,
                message=failure_message(res),
                ignored=bool(data.get("ignore_errors")),
                error_code=str(res.get("error_code") or (failed_item(res) or {}).get("error_code") or ""),
            )
        ]
    if kind == "runner_on_unreachable":
        return [HostUnreachable(counter, stdout, host=host, task=task, message=failure_message(res))]
    if kind == "runner_retry":
        out = [
            TaskRetry(
                counter,
                stdout,
                host=host,
                task=task,
                attempt=int(res.get("attempts") or 0),
                retries=int(res.get("retries") or 0),
            )
        ]
        progress = _progress(counter, stdout, host, res)
        if progress:
            out.append(progress)
        return out
    if kind == "playbook_on_stats":
        stats = {
            key: dict(data.get(key) or {})
            for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored", "processed")
        }
        artifact = data.get("artifact_data")
        return [PlaybookFinished(counter, stdout, playbook=data.get("playbook", ""), stats=stats,
                                 artifact_data=dict(artifact) if isinstance(artifact, dict) else {})]
    return []
