"""What a training run is to forja's verbs: its name, its id, how it reads on a host, what `train` returns.

Why a module of its own: a run is sent by `forja.training`, followed there or by `forja.vertex`, watched
by `forja.managed` and shown by the CLI and the dashboard. Each needs the same name rule, the same id
and the same result types; kept here, under all of them, none of them imports another to get one.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forja import errors, runstate
from forja.history import RunRecord, now
from forja.runner import RunResult

#: What a run name may be: the host contract's pattern (roles/host_contract), which trainer_run checks too.
RUN_NAME = runstate.RUN_NAME

__all__ = ["RUN_NAME", "TrainResult", "TrainStatus", "checked_name", "config_hash", "how_to_follow",
           "new_run_id", "now", "rank0"]


@dataclass(frozen=True)
class TrainStatus:
    """One run on one host, as the host reports it."""

    host: str
    run: str
    status: str
    unit_state: str
    step: int | None
    total_steps: int | None
    loss: float | None
    exit_status: int
    restarts: int
    node_rank: int
    summary: dict[str, Any] | None = None
    journal: str = ""
    #: Nodes of the run (1: one VM); node_rank is this host's among them.
    nnodes: int = 1
    #: Worker-group restarts of torchrun's elastic agent on this node (None: not an elastic run).
    elastic_restarts: int | None = None
    #: Seconds the run waited in its host's queue: so far while "queued", in all once the queue started it
    #: (None: it never went through a queue).
    waited_s: float | None = None

    @classmethod
    def from_state(cls, host: str, state: runstate.RunState) -> TrainStatus:
        """The status a host's published run state reads as (the unit's two states in one field)."""
        elastic = state.elastic_restarts if state.elastic is not None else None
        return cls(
            host=host, run=state.run, status=state.status,
            unit_state=f"{state.active_state}/{state.sub_state}", step=state.step,
            total_steps=state.total_steps, loss=state.loss, exit_status=state.exit_status,
            restarts=state.restarts, node_rank=state.node_rank, summary=state.summary,
            journal=state.journal, nnodes=state.nnodes, elastic_restarts=elastic,
            waited_s=(state.queue or {}).get("waited_s"),
        )


@dataclass(frozen=True)
class TrainResult:
    """What `Forja.train` did: the run, where its results are, and the playbook's own result."""

    run_id: str
    status: str
    hosts: list[str]
    summary: dict[str, Any]
    artifact_dir: Path | None
    playbook_result: RunResult | None = field(default=None, repr=False)
    #: None when forja followed the run to its end; otherwise why it stopped following while the
    #: run goes on: "detach" (asked not to wait), "timeout" (the caller's limit), "interrupted"
    #: (Ctrl-C, KeyboardInterrupt or `cancel`). `follow()` picks the run up again.
    detached: str | None = None
    #: What of the config the controller could not check, imported only where the run starts
    #: ("model pkg.mod:net", forja.trainer_config.Judged); empty for a script or a run followed again.
    unchecked: tuple[str, ...] = ()
    #: The run's cost (docs/cost-definition.md): its VMs' time for the run plus their disks, as the
    #: history holds it once the run ended; the figure `forja runs` and every view show as "cost".
    #: None while it runs or when no rate is known.
    cost_usd: float | None = None
    #: Of which training: the trainer's own count (its summary.json's cost_usd), a part of `cost_usd`
    #: (forja.cost.run.RunCost.training_usd, the same name); never left in `summary` as a second cost.
    training_usd: float | None = None

    @classmethod
    def ended(cls, record: RunRecord, cost_usd: float | None, summary: Mapping[str, Any],
              artifact_dir: Path | None, playbook_result: RunResult | None = None) -> TrainResult:
        """The result of a run that ended, as the history records it (status, hosts), with its settled
        cost (forja.cost_report.settled_cost) and the trainer's summary less its own cost_usd, which
        becomes `training_usd`."""
        rest = dict(summary)
        training = rest.pop("cost_usd", None)
        training_usd = float(training) if isinstance(training, int | float) else None
        return cls(record.run_id, record.status, list(record.hosts), rest, artifact_dir, playbook_result,
                   cost_usd=cost_usd, training_usd=training_usd)


def how_to_follow(run_id: str) -> str:
    """What to tell a person whose command stopped following a run that goes on."""
    return (f"follow it with `forja follow {run_id}` or `forja logs -f {run_id}`; "
            f"stop it with `forja stop {run_id}`")


def checked_name(name: str) -> str:
    """`name` when it is a run name; a ConfigError naming it otherwise, before anything runs."""
    if not RUN_NAME.match(name):
        raise errors.ConfigError("name", f"{name!r} is not a run name")
    return name


def config_hash(path: Path) -> str:
    """The history's key for "the same config": the file's bytes (`train` records it with each run,
    and the estimate finds earlier runs of a config by it)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def new_run_id(config: Path) -> str:
    """A fresh run id from what is run (a config's or a script's file name), the time and a random tail."""
    stem = re.sub(r"[^A-Za-z0-9_-]", "-", config.stem)[:30] or "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def rank0(pairs: Sequence[tuple[str, runstate.RunState]]) -> runstate.RunState | None:
    """The state that speaks for a run: its rank-0 host's (the one that writes the summary)."""
    # A host that does not know the run (status "unknown", rank 0 by default) speaks only when none does.
    ranked = sorted(pairs, key=lambda pair: (pair[1].status == "unknown", pair[1].node_rank, pair[0]))
    return ranked[0][1] if ranked else None
