"""The state of a training run as its host reports it: one typed reader for forja-train-state's JSON.

`roles/trainer_run/files/forja-train-state` prints one versioned document per run (key
`forja_train_state`, the schema version). The role publishes those documents with `set_stats`
(`trainer_run_states`: {host: [state, ...]}), which ansible-runner hands over as the run's
artifact data, and every poll of the wait task carries one in its stdout. Python reads them here
and nowhere else: status, progress events, following, `logs -f` and the history sync all get a
`RunState`, recognised by its schema key, never by the name of the task that printed it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: The key that marks a forja-train-state document, and the version this reader understands.
SCHEMA_KEY = "forja_train_state"
SCHEMA_VERSION = 1
#: Statuses after which a run changes no more (until something starts it again).
FINAL = ("completed", "failed", "preempted", "stopped")
#: The artifact-data key the trainer_run role publishes the states under.
STATS_KEY = "trainer_run_states"


class RunState(BaseModel):
    """One run on one host: the unit's state, its newest metrics line, its summary once written."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    run: str
    status: str = "unknown"
    active_state: str = ""
    sub_state: str = ""
    exit_status: int = 0
    restarts: int = 0
    node_rank: int = 0
    nnodes: int = 1
    out_dir: str = ""
    configured_at: str | None = None
    total_steps: int | None = None
    last: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    journal: str = ""
    journal_cursor: str = ""
    schema_version: int = Field(default=SCHEMA_VERSION, alias=SCHEMA_KEY)

    @property
    def final(self) -> bool:
        return self.status in FINAL

    @property
    def step(self) -> int | None:
        value = (self.last or {}).get("step")
        return int(value) if isinstance(value, int | float) else None

    @property
    def loss(self) -> float | None:
        value = (self.last or {}).get("loss")
        return float(value) if isinstance(value, int | float) else None


def parse(document: object) -> RunState | None:
    """A RunState from a decoded document or a JSON line; None when it is not a state document."""
    if isinstance(document, str | bytes):
        try:
            document = json.loads(document or "null")
        except ValueError:
            return None
    if not isinstance(document, Mapping) or SCHEMA_KEY not in document:
        return None
    try:
        return RunState.model_validate(document)
    except ValidationError:
        return None


def from_stats(artifact_data: Mapping[str, Any]) -> list[tuple[str, RunState]]:
    """(host, state) pairs from a playbook's artifact data, hosts in name order."""
    per_host = artifact_data.get(STATS_KEY) or {}
    pairs: list[tuple[str, RunState]] = []
    if not isinstance(per_host, Mapping):
        return pairs
    for host in sorted(per_host):
        docs = per_host[host]
        for doc in docs if isinstance(docs, list) else [docs]:
            state = parse(doc)
            if state is not None:
                pairs.append((str(host), state))
    return pairs
