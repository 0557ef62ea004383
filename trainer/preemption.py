"""Turn SIGTERM (a Spot VM being taken away, systemd stopping the unit) into a clean save and exit.

Why a flag and not work in the handler: the handler can fire inside a backward pass or a
collective. It only records the request; the loop checks it at the next step boundary, all ranks
agree on it with one tiny all-reduce (so they stop at the same step), rank 0 saves, and the process
exits with code 3. GCE gives a Spot VM about 30 s between the signal and the hard stop; one step
plus one save is far less than that for the models this trainer is meant for.

A Flex-start VM gets no signal worth waiting for: Google ends it at its max run duration, a time
known in advance. forja passes that time as ``FORJA_ENDS_AT`` (the VM's `ends_at`, through the
trainer_run role's run environment), and the loop stops there ``FORJA_ENDS_MARGIN_S`` early, the
same way as for a signal: save, mirror, exit 3 (preempted), to be resumed on the next VM.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

# What `forja stop` leaves in the run's folder before it stops the unit (trainer.run_folder's
# STOP_REQUESTED, roles/trainer_run/tasks/stop.yml). A SIGTERM is a SIGTERM: without it, the user's own
# stop counted as a preemption, and `preemptions` then said the VM was taken away when it never was.
from trainer.run_folder import STOP_REQUESTED

#: When the VM ends (RFC 3339, or Unix seconds): a Flex-start VM's end of run.
ENDS_AT_ENV = "FORJA_ENDS_AT"
#: How many seconds before that end the run saves, mirrors and stops.
ENDS_MARGIN_ENV = "FORJA_ENDS_MARGIN_S"
#: Ten minutes: a save plus a mirror of a checkpoint of a few GB, with room to spare.
DEFAULT_ENDS_MARGIN_S = 600.0
#: The stop's name in the `preempt` event when the VM's end, not a signal, stopped the run.
VM_END = "VM_END"


class VmEnd:
    """The moment the run must have stopped by: the VM's end less the margin (None: no end).

    An end already past when the run starts is stale, not a reason to stop at once: a VM that Google
    stopped at its end and that was started again boots with the run environment of its last period
    (its new end is not known there). It is ignored (`stale` says so), and the run checkpoints as
    usual; a run sent again (the watcher's move, `forja train`) gets the new end.
    """

    def __init__(self, stop_at: float | None, stale: str = "") -> None:
        self.stop_at = stop_at
        self.stale = stale

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, now: float | None = None) -> VmEnd:
        """Read FORJA_ENDS_AT and FORJA_ENDS_MARGIN_S; an unreadable value is an error naming it."""
        env = os.environ if environ is None else environ
        text = (env.get(ENDS_AT_ENV) or "").strip()
        if not text:
            return cls(None)
        margin_text = (env.get(ENDS_MARGIN_ENV) or "").strip()
        try:
            margin = float(margin_text) if margin_text else DEFAULT_ENDS_MARGIN_S
        except ValueError:
            margin = math.nan
        if not margin >= 0:  # also NaN
            raise ValueError(f"{ENDS_MARGIN_ENV}: '{margin_text}' is not a number of seconds >= 0")
        ends = instant(text)
        if ends <= (time.time() if now is None else now):
            return cls(None, stale=f"{ENDS_AT_ENV}={text} is past: the VM's end of a period before this one")
        return cls(ends - margin)

    def due(self, now: float | None = None) -> bool:
        return self.stop_at is not None and (time.time() if now is None else now) >= self.stop_at


def instant(text: str) -> float:
    """Unix seconds of an RFC 3339 time (Google's, with an offset) or of a number of seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{ENDS_AT_ENV}: '{text}' is neither an RFC 3339 time nor Unix seconds") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()


def stopped_by(run_dir: Path) -> dict[str, Any]:
    """The preempt event's extra field when the stop was the user's (``requested_by``), else none:
    what the request says, "forja stop" (roles/trainer_run/tasks/stop.yml) or "forja down" (the VM's
    shutdown that forja down asked for: tasks/down.yml)."""
    try:
        said = (run_dir / STOP_REQUESTED).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return {}
    return {"requested_by": said if said in ("forja stop", "forja down") else "forja stop"}


def forget_stop_request(run_dir: Path) -> None:
    """At a session's start: the stop that the request was for is over (a later SIGTERM is Google's)."""
    (run_dir / STOP_REQUESTED).unlink(missing_ok=True)


class StopRequest:
    """Installs handlers for SIGTERM and SIGINT while active; restores the previous ones on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)
    REPEAT_AFTER_S = 3.0

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def request(self, name: str) -> None:
        """A stop that is not a signal (the VM's end is near): the loop treats it as one."""
        if self.signal_name is None:
            self.signal_name = name
            self.received_at = time.monotonic()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is None:
            self.signal_name = signal.Signals(signum).name
            self.received_at = time.monotonic()
            return
        # The same stop often arrives twice at once: systemd signals the whole cgroup *and* torchrun
        # forwards its own copy. Only a later, deliberate second signal (Ctrl-C again while a peer
        # hangs in a collective) means "stop now, without saving".
        if self.received_at is not None and time.monotonic() - self.received_at > self.REPEAT_AFTER_S:
            self._restore()
            signal.raise_signal(signum)

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def __enter__(self) -> StopRequest:
        for sig in self.SIGNALS:
            # not the main thread (e.g. a notebook's worker thread): handlers cannot be installed there
            with contextlib.suppress(ValueError):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._restore()
