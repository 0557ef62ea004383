"""The state of a training run as its host reports it: one typed reader for forja-train-state's JSON.

`roles/trainer_run/files/forja-train-state` prints one versioned document per run (key
`forja_train_state`, the schema version). The role publishes those documents with `set_stats`
(forja's data contract, `forja.contract`: {host: {runs: [state, ...]}}), and every poll of the
wait task carries one in its stdout. `parse` here is their one reader: status, progress events,
following, `logs -f` and the history all get a `RunState`, recognised by its schema key, never by
the name of the task that printed it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from forja import host_contract

#: The key that marks a forja-train-state document, and the version this reader understands.
SCHEMA_KEY = "forja_train_state"
SCHEMA_VERSION = 1


class _RunNamePattern:
    """The host contract's run-name pattern (host_contract_run_name_pattern), read on first use."""

    def match(self, text: str) -> re.Match[str] | None:
        return host_contract.run_name_pattern().match(text)

    @property
    def pattern(self) -> str:
        return host_contract.run_name_pattern().pattern


#: What a run name may be: the host contract's pattern, the one trainer_run validates with.
RUN_NAME = _RunNamePattern()


def final_statuses() -> frozenset[str]:
    """Statuses after which a run changes no more: the host contract's host_contract_run_final_statuses,
    the list trainer_run's wait task stops on."""
    return host_contract.final_statuses()


class RunState(BaseModel):
    """One run on one host: the unit's state, its newest metrics line, its summary once written.

    Keys it does not name are ignored, not refused: a document from a newer reader still parses, and
    `results` (forja-train-state --results, the file listing the role's fetch.yml uses) is the role's.
    """

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
    #: On several nodes, this node's torchrun round: restart_count, max_restarts, rank, world_size, nodes.
    elastic: dict[str, Any] | None = None
    journal: str = ""
    journal_cursor: str = ""
    #: The end of the run folder's hook.log (the user's hooks' output, trainer_run_hooks) and its length in
    #: lines; forja-train-state sends them with the journal.
    hook_log: str = ""
    hook_log_lines: int = 0
    #: A run sent through the host's queue (forja/queue.py): while "queued" its position, priority,
    #: waited_s, gpu_memory_mib and why it waits; once out, how it left (outcome), its wait, any reason.
    queue: dict[str, Any] | None = None
    schema_version: int = Field(default=SCHEMA_VERSION, alias=SCHEMA_KEY)

    @property
    def final(self) -> bool:
        return self.status in final_statuses()

    @property
    def step(self) -> int | None:
        value = (self.last or {}).get("step")
        return int(value) if isinstance(value, int | float) else None

    @property
    def elastic_restarts(self) -> int:
        """Worker-group restarts torchrun's elastic agent made on this node since its unit last started."""
        value = (self.elastic or {}).get("restart_count")
        return int(value) if isinstance(value, int) else 0

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

