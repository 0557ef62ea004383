"""The defaults that both a verb and its `forja` option read, in a module that imports nothing.

Why a module of their own: the CLI shows each default in its `--help` (`--max-down  [default: 6h]`),
and the modules that use them (forja/managed.py, forja/following.py, ...) load the API's data contract
(pydantic) on import. Kept here, one floor down, `forja --help` shows them without loading the API,
and each using module still has its name for it (`forja.managed.MAX_DOWN` is this `MAX_DOWN`).
"""

from __future__ import annotations

# -- the managed watcher (forja/managed.py: `forja watch`, `forja train --managed`, sweeps) ------
#: Seconds between two looks at a watched VM (one small playbook each).
MANAGED_POLL_S = 30.0
#: Most recoveries (restarts in place and zone moves together).
MAX_RECOVERIES = 10
#: Most time down, as `--max-down` writes it (`forja.managed.seconds()` reads it).
MAX_DOWN = "6h"

# -- training and following (forja/training.py, forja/following.py) -----------------------------
#: Where a run goes: the inventory's VMs (the default, first) or a Vertex AI custom job.
BACKENDS = ("vm", "vertex")
#: Journal lines per host that `logs` shows (and `follow_logs` starts with) unless told otherwise.
LOG_LINES = 50

# -- datasets (forja/datasets.py) --------------------------------------------------------------
#: Parallel uploads of a push unless told otherwise.
PUSH_THREADS = 8

# -- cost and plans (forja/cost_report.py, forja/plan.py) ---------------------------------------
#: The fraction of a cap at which `cost` warns.
WARN_AT = 0.8
#: What a cap applies to: each instance (the default, first) or the whole project.
SCOPES = ("instance", "project")
#: The machine a plan targets unless told: the project's VM (one L4).
DEFAULT_MACHINE = "g2-standard-8"

# -- sweeps and Vertex AI (forja/sweep.py, forja/vertex.py) --------------------------------------
#: Seconds between two looks at a sweep's running trials (one status playbook per VM).
SWEEP_POLL_S = 15.0
#: Seconds between two looks at a Vertex AI job's state and its new log lines.
VERTEX_POLL_S = 5.0
