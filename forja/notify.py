"""Notifications: a run's events posted as JSON to one incoming-webhook URL (Slack, Discord, your own).

Why this shape:
- **The payload is one flat JSON object** with `event`, `run`, `vm`, `text`, `cost_usd`, `time` and
  `details`. `text` (Slack) and `content` (Discord) carry the same human-readable line, so the URL of
  a Slack or Discord incoming webhook works as it is; a receiver of your own reads the fields.
- **Posting never blocks or fails a run.** Events go to a queue that one daemon thread posts, with
  retries and exponential backoff; a receiver that is slow, down or answering 500 costs the run
  nothing. When it fails, that is said once (one warning line, never the URL), not once per event.
- **The URL is a secret** (whoever holds it can post to the channel). It is never logged, never put
  in an error message, never on a command line: the command reads it from the environment
  (`FORJA_NOTIFY_WEBHOOK`) or from the inventory variable `notify_webhook` (the one the VM's
  autostop agent uses too, written there to a root-only file); `Notifier`'s repr hides it.

Standard library only (urllib), so the same rules serve the controller and, copied, nothing else.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from forja import errors

#: The setting's name (the inventory variable, the API's keyword) and the environment variable.
SETTING = "notify_webhook"
ENV = "FORJA_NOTIFY_WEBHOOK"

#: Every kind of event forja posts. `disk_deleted` is the stopped-disk prune's (forja/prune.py:
#: `forja prune --notify`), with the disk's monthly cost it saves.
KINDS = (
    "run_started", "run_finished", "run_failed", "run_stopped",
    "preempted", "restarted", "zone_moved", "stockout", "gave_up",
    "autostop", "budget_reached", "disk_deleted",
)

#: Tries per event, and the first pause between two (doubled after each: 0.5, 1, 2 s).
TRIES = 4
BACKOFF_S = 0.5
#: Seconds one POST may take before it counts as failed.
TIMEOUT_S = 5.0
#: Seconds the process waits at exit for events still queued (a dead receiver costs at most this).
DRAIN_S = 10.0


def checked_url(url: str, setting: str = SETTING) -> str:
    """The URL, or a ConfigError naming the setting and the fix (never the URL itself: a secret)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        scheme = f"its scheme is {parts.scheme!r}" if parts.scheme else "it has no http:// or https://"
        raise errors.ConfigError(
            setting,
            f"the webhook is not an http(s) URL ({scheme}); give the incoming-webhook URL itself, "
            f"e.g. https://hooks.slack.com/services/... or https://discord.com/api/webhooks/..., in "
            f"{ENV} or the inventory variable {SETTING}",
        )
    return url.strip()


@dataclass(frozen=True)
class Event:
    """One notification: what happened to which run on which VM, in words and in fields."""

    kind: str
    run: str
    text: str
    vm: str = ""
    cost_usd: float | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    time: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def payload(self) -> dict[str, Any]:
        """The JSON body: forja's fields, plus `text` (Slack) and `content` (Discord, <= 2000 chars)."""
        return {
            "event": self.kind, "run": self.run, "vm": self.vm, "text": self.text,
            "content": self.text[:2000], "cost_usd": self.cost_usd, "time": self.time,
            "details": {k: v for k, v in self.details.items() if v is not None},
        }


def post(url: str, body: Mapping[str, Any], timeout_s: float = TIMEOUT_S) -> None:
    """POST the body as JSON once; raises OSError (urllib.error.HTTPError for a 4xx/5xx answer)."""
    request = urllib.request.Request(
        url, data=json.dumps(body, default=str).encode(), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "forja-notify"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # http(s) only: checked_url
        answer.read()


def _why(exc: BaseException) -> str:
    """A failure in words without the URL (urllib's messages may quote it)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return type(reason).__name__ if isinstance(reason, BaseException) else "no connection"
    return type(exc).__name__


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Notifier:
    """Posts events to one webhook from a daemon thread; `send` returns at once.

    Args:
        url: the webhook (checked: http or https).
        say: where the one warning line goes when posting fails (stderr by default).
        tries, backoff_s, timeout_s: retries (exponential backoff) and the limit of one POST.
        sleep: the pause between tries (tests pass their own).
    """

    def __init__(
        self, url: str, *, say: Callable[[str], None] = _stderr, tries: int = TRIES,
        backoff_s: float = BACKOFF_S, timeout_s: float = TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._url = checked_url(url)
        self.say = say
        self.tries = max(1, tries)
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.sleep = sleep
        self.failed = False  # said once: set when the first event could not be posted
        self.posted: list[Event] = []
        self._queue: queue.Queue[Event | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        atexit.register(self.drain, DRAIN_S)

    def __repr__(self) -> str:  # never the URL
        return f"Notifier(webhook=<hidden>, failed={self.failed})"

    def send(self, event: Event) -> None:
        """Queue the event for posting; never blocks, never raises."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="forja-notify", daemon=True)
                self._thread.start()
        self._queue.put(event)

    def drain(self, timeout_s: float = DRAIN_S) -> bool:
        """Wait up to `timeout_s` for the queued events to be posted (or given up); True when done."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._queue.unfinished_tasks

    def _work(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is not None:
                    self._deliver(event)
            finally:
                self._queue.task_done()

    def _deliver(self, event: Event) -> None:
        body, pause = event.payload(), self.backoff_s
        for attempt in range(1, self.tries + 1):
            try:
                post(self._url, body, self.timeout_s)
            except (OSError, ValueError) as exc:
                # a 4xx other than 408/429 will not change by asking again
                final = isinstance(exc, urllib.error.HTTPError) and exc.code in range(400, 500) \
                    and exc.code not in (408, 429)
                if attempt < self.tries and not final:
                    self.sleep(pause)
                    pause *= 2
                    continue
                self._fail(event, f"{_why(exc)} after {attempt} {'try' if attempt == 1 else 'tries'}")
                return
            self.posted.append(event)
            return

    def _fail(self, event: Event, why: str) -> None:
        if self.failed:
            return
        self.failed = True
        with contextlib.suppress(Exception):  # a warning must never fail the run
            self.say(
                f"notify: the webhook did not take the {event.kind.replace('_', ' ')} event of run "
                f"{event.run} ({why}); the run goes on, and later failures are not repeated. Check the "
                f"URL in {ENV} or the inventory's {SETTING}."
            )


def from_setting(
    given: str | bool | None, inventory_value: Callable[[], str | None] = lambda: None,
    *, say: Callable[[str], None] = _stderr,
) -> Notifier | None:
    """The notifier a run asked for, or None.

    `given`: False or None, no notifications; a string, the URL itself (the Python API; never from a
    command line); True (`--notify`), the URL from FORJA_NOTIFY_WEBHOOK, else the inventory's
    `notify_webhook`. Asked and not found, or not http(s): ConfigError before anything is created.
    """
    if not given:
        return None
    url = given if isinstance(given, str) else (os.environ.get(ENV) or inventory_value() or "")
    if not url.strip():
        raise errors.ConfigError(
            "--notify", f"no webhook URL to post to: set {ENV} in the environment (export "
            f"{ENV}=https://hooks.slack.com/services/...) or the inventory variable {SETTING}. The URL "
            "is a secret, so it is never given on the command line.",
        )
    return Notifier(url, say=say)
