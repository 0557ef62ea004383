"""Turn SIGTERM (a Spot VM being taken away, systemd stopping the unit) into a clean save and exit.

Why a flag and not work in the handler: the handler can fire inside a backward pass or a
collective. It only records the request; the loop checks it at the next step boundary, all ranks
agree on it with one tiny all-reduce (so they stop at the same step), rank 0 saves, and the process
exits with code 3. GCE gives a Spot VM about 30 s between the signal and the hard stop; one step
plus one save is far less than that for the models this trainer is meant for.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

# What `forja stop` leaves in the run's folder before it stops the unit (trainer.run_folder's
# STOP_REQUESTED, roles/trainer_run/tasks/stop.yml). A SIGTERM is a SIGTERM: without it, the user's own
# stop counted as a preemption, and `preemptions` then said the VM was taken away when it never was.
from trainer.run_folder import STOP_REQUESTED


def stopped_by(run_dir: Path) -> dict[str, Any]:
    """The preempt event's extra field when the stop was the user's (``requested_by``), else none."""
    return {"requested_by": "forja stop"} if (run_dir / STOP_REQUESTED).exists() else {}


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
