"""Typed errors of the forja API.

Every error carries what a user needs to act on it (the host, the task, the message from
Ansible) and the CLI exit code that stands for it, so scripts can tell "the host is down"
(retry later) from "a task failed" (fix something) without parsing text.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of the `forja` command; documented in `forja --help` (EXIT_CODES_HELP) and SKILL.md."""

    OK = 0
    PLAYBOOK_FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    CANCELLED = 4
    NOT_FOUND = 5
    STOPPED = 6
    #: `forja train`/`follow` stopped following a run that goes on (--timeout expired, Ctrl-C).
    STILL_RUNNING = 7
    #: The run diverged (NaN, Inf or over its loss bound) and was stopped: not restarted, nothing exported.
    DIVERGED = 8
    #: `forja check` (or the check `forja up` runs first) found a problem that blocks creating the VM.
    CHECK_FAILED = 9


class ForjaError(Exception):
    """Base class: anything forja raises on purpose."""

    exit_code: ExitCode = ExitCode.PLAYBOOK_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(ForjaError):
    """Bad input from the user: names the field and the fix; nothing was changed.

    `source` is the file the field is in when it is one (an inventory): the message then names it,
    `inventory /path/gcp_gpu.yml: projects: no project given; ...`, the cause in the file's own words.
    """

    exit_code = ExitCode.USAGE

    def __init__(self, field: str, message: str, *, source: str = "") -> None:
        super().__init__(f"{field} {source}: {message}" if source else f"{field}: {message}")
        self.field = field
        self.source = source


class PlaybookFailed(ForjaError):
    """A task failed on a host; `task` and `message` come from Ansible's own result."""

    exit_code = ExitCode.PLAYBOOK_FAILED

    def __init__(self, host: str, task: str, message: str, playbook: str = "", code: str = "") -> None:
        where = f" in {playbook}" if playbook else ""
        if task.strip(" -") and host.strip(" -"):  # the cause first, then where it happened
            super().__init__(f"{message} (task '{task}' on {host}{where})")
        else:  # Ansible stopped before any task ran (it could not parse the play, or not start)
            super().__init__(f"{playbook or 'the playbook'}: {message}")
        self.host = host
        self.task = task
        self.detail = message
        self.playbook = playbook
        #: The module's error code when it gave one (the Compute API's, for the gcp modules).
        self.code = code


class CheckFailed(ForjaError):
    """The project's preflight found what blocks creating the VM; nothing was created. `report` is
    the whole preflight (a forja.contract.PreflightReport), every finding with its fix."""

    exit_code = ExitCode.CHECK_FAILED

    def __init__(self, report: object, problems: list[str]) -> None:
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__(f"nothing was created: the check found {count}:\n" + "\n".join(
            f"  - {p}" for p in problems))
        self.report = report


class RunDiverged(PlaybookFailed):
    """The followed run stopped as "diverged" (trainer.divergence): a PlaybookFailed of its own exit
    code, so a script (or a sweep) tells a bad hyperparameter from a broken host."""

    exit_code = ExitCode.DIVERGED

    @classmethod
    def of_job(cls, job: str, message: str) -> RunDiverged:
        """A run no playbook followed (a Vertex AI job, `job` its name): `message` is all it says."""
        diverged = cls(job, "", message)
        diverged.message = message
        diverged.args = (message,)
        return diverged


class HostUnreachable(ForjaError):
    """Ansible could not reach a host (SSH refused, timed out, wrong key...)."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, host: str, message: str, task: str = "") -> None:
        super().__init__(f"host {host} is unreachable: {message}")
        self.host = host
        self.task = task
        self.detail = message


class HostStopped(HostUnreachable):
    """The host is a VM that is stopped (its inventory record says so): start it, don't debug SSH.

    A subclass of `HostUnreachable`, so code that handles "unreachable" still does; its own exit
    code (6) lets a script tell "start the VM" (`forja up`) from "the network is broken" (3).
    """

    exit_code = ExitCode.STOPPED

    def __init__(self, host: str, status: str, since: str | None = None, why: str | None = None,
                 task: str = "") -> None:
        ForjaError.__init__(self, stopped_message(host, status, since, why))
        self.host = host
        self.task = task
        self.status = status
        self.since = since
        self.why = why
        self.detail = self.message


def stopped_message(host: str, status: str, since: str | None, why: str | None) -> str:
    """One plain sentence: what, since when, why if known, and how to start it."""
    text = f"host {host} is stopped (status {status}"
    text += f" since {since})" if since else ")"
    if why:
        text += f"; {why}"
    return text + ". Start it with `forja up` (or `forja tunnel --start`)."


class Cancelled(ForjaError):
    """The caller cancelled the run (its cancel token or stream, Ctrl-C)."""

    exit_code = ExitCode.CANCELLED

    def __init__(self, message: str = "the run was cancelled") -> None:
        super().__init__(message)


class RunNotFound(ForjaError):
    """A run id or name that the history does not know."""

    exit_code = ExitCode.NOT_FOUND
