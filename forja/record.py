"""`python -m forja.record`: the train playbook's record of a run started outside forja (site.yml,
`ansible-playbook`) in the run history on the controller, so it is in `forja runs`, with its cost.

A feature above the history, not the history's own: pricing the run (forja.cost_report) sits above
the core, and the history module (core) must not import it, even lazily. Kept light: the playbook
starts it once per run, and it loads only what recording and pricing need.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from forja import runstate
from forja.errors import RunNotFound
from forja.history import History


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m forja.record --state JSON --hosts a,b`: what the train playbook calls on the
    controller so a run started outside forja (site.yml) is in `forja runs`. Prints changed/unchanged,
    then a JSON line with the run's cost as every view shows it (site.yml's summary prints it)."""
    parser = argparse.ArgumentParser(prog="python -m forja.record",
                                     description="add or update a run from its rank-0 host's state document")
    rec = parser
    rec.add_argument("--state", required=True, help="the forja-train-state JSON of the run's rank-0 host")
    rec.add_argument("--hosts", default="", help="comma-separated hosts of the run")
    rec.add_argument("--config", default=None, help="the run's config path on the controller")
    rec.add_argument("--instances", default=None,
                     help="JSON list of the run's VM records (filter forja_price_record), to price it")
    args = parser.parse_args(argv)
    state = runstate.parse(args.state)
    if state is None:
        print(f"--state: not a forja-train-state document (needs {runstate.SCHEMA_KEY!r})", file=sys.stderr)
        return 2
    try:
        instances = json.loads(args.instances) if args.instances else []
    except ValueError as exc:
        print(f"--instances: not JSON ({exc}); give a list of instance records", file=sys.stderr)
        return 2
    if not isinstance(instances, list) or not all(isinstance(i, dict) for i in instances):
        print("--instances: give a JSON list of instance records (objects)", file=sys.stderr)
        return 2
    hosts = [h for h in args.hosts.split(",") if h]
    history = History()
    changed = history.record_host_run(state, hosts=hosts, config_path=args.config or None,
                                      message="started outside forja (ansible-playbook)")
    print("changed" if changed else "unchanged")
    print(json.dumps({"run": state.run, "cost_usd": _settled(history, state.run, instances, changed)}))
    return 0


def _settled(history: History, run_id: str, instances: list[dict[str, Any]], changed: bool) -> float | None:
    """The run's cost once it has ended (settled when its row changed; None while it runs or unpriced).

    Only for a run that just ended: a re-run of site.yml prints the figure already settled."""
    try:
        record = history.get(run_id)
    except RunNotFound:
        return None
    if record.ended_at is None or (not changed and record.cost_usd is not None):
        return record.cost_usd
    from forja.cost_report import settle  # pricing loads only for a run that just ended
    from forja.session import Session

    found = settle(Session(history=history), run_id, instances)
    return found.cost_usd if found is not None else history.get(run_id).cost_usd


if __name__ == "__main__":
    sys.exit(main())
