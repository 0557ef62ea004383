"""`forja train --again RUN`: a run's snapshot sent as a new run, on the VM, managed on Spot, or on Vertex AI.

Why a module of its own, above training, managed and vertex: the snapshot (forja/snapshot.py, in the
core) says what ran and puts its code back, from a temporary worktree when the project has moved on;
sending is the features' work, and each way of sending takes the same snapshot. What is sent is
decided once, by `sending`, before anything is sent (the tests read its decision directly). The
worktree lives while the run is sent, and for a managed run while it is watched; a recovery that must
send the run again (a zone move) puts it back from the snapshot once more (forja.managed keeps
"again": RUN and `managed.resent` reads it), since a watcher started again later (`forja watch`)
outlives this process's temporary folders.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from forja import managed, snapshot, training
from forja.runs import TrainResult, new_run_id
from forja.session import Session


@dataclass(frozen=True)
class Sending:
    """A run sent again, as decided before anything is sent.

    `keywords` are `Forja.train`'s (or `train_managed`'s); their config and project may lie in
    temporary folders, which live only while `sending`'s context does. `said`: where the code comes
    from, for people."""

    said: str
    keywords: dict[str, Any]


@contextlib.contextmanager
def sending(
    session: Session,
    run: str,
    *,
    backend: str = "vm",
    name: str | None = None,
    train: Mapping[str, Any] | None = None,
) -> Iterator[Sending]:
    """What sending run `run` again sends: its snapshot's config (the copy kept with it), script,
    arguments, project (its commit and uncommitted changes in a temporary worktree when the project
    differs), exclusions, processes, hooks and -e variables; then the caller's `train` keywords over
    them, its -e variables over the run's. `name`, else a new one from the run's config or script.
    A Vertex AI job of a run sent with hooks or -e variables is refused (snapshot.Again.keywords)."""
    given = dict(train or {})
    with snapshot.again(session, run) as plan:
        how = {**plan.keywords(backend), "name": name or new_run_id(plan.name_source)}
        if "extravars" in how:
            how["extravars"] = {**how["extravars"], **(given.pop("extravars", None) or {})}
        yield Sending(plan.said, {**how, **given})


def train_again(
    session: Session,
    run: str,
    *,
    name: str | None = None,
    backend: str = "vm",
    **train: Any,
) -> TrainResult:
    """Send run `run` again from its snapshot as a new run: the same config, script, arguments,
    exclusions, processes, hooks and -e variables, and the same code (its commit and uncommitted
    changes, from a temporary worktree when the project differs; `say` hears which). `name`
    defaults to a new name from the run's config or script. `backend="vertex"` sends it as a Vertex
    AI job (`vertex`: its options), which takes no hooks nor -e variables: a run sent with them is
    refused, naming them. The other keywords are `train`'s (wait, timeout_s, queue, ...).

    Example: Forja().train_again("digits-1", backend="vertex", vertex=VertexOptions(bucket="gs://b"))
    """
    with sending(session, run, backend=backend, name=name, train=train) as sent:
        if train.get("say") is not None:
            train["say"](sent.said)
        return training.train(session, backend=backend, **sent.keywords)


def train_managed_again(
    session: Session,
    run: str,
    *,
    fallback_zones: Sequence[str],
    name: str | None = None,
    say: Callable[[str], None] = print,
    **train: Any,
) -> str:
    """`train_again` as a managed Spot run (`train_managed`: `fallback_zones`, `budget`, `poll_s`,
    `notify`; `say` hears the watcher and where the code came from): sent, then watched until it
    ends; a zone move sends it again from the same snapshot. Returns why watching ended.

    Example: Forja().train_managed_again("digits-1", fallback_zones=["us-east1-b"])
    """
    managed.checked_request(fallback_zones, train.get("budget"))  # before a worktree is made
    with sending(session, run, name=name, train=train) as sent:
        say(sent.said)
        how = dict(sent.keywords)
        return managed.train_managed(session, how.pop("config"), fallback_zones=fallback_zones, say=say,
                                     again=run, **how)
