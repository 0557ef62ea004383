"""The GPU hosts' lifecycle: create or start them, configure them, look at them, stop or delete them.

Why a module of its own: these are the verbs every other feature stands on (the managed watcher
starts, moves and configures a VM through them; the tunnel starts a stopped one), and each is one
playbook of the collection run over the session, with nothing of its own to decide.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forja import contract, deletion, preflight
from forja import events as ev
from forja.runner import RunResult
from forja.session import Session


def up(session: Session, extravars: Mapping[str, Any] | None = None, check: bool = True) -> RunResult:
    """Create or start the GPU host(s): playbooks/provision.yml (extravars: e.g. another zone).

    It checks the project first (what `forja check` does) and raises CheckFailed, creating
    nothing, when something blocks: no quota, an API off, a missing permission or tool. `check=False`
    (`forja up --no-check`) skips the check.

    A Flex-start VM (gcp_instance_provisioning_model: flex_start) waits at Google for capacity, up to
    gcp_instance_flex_start_wait: each look that finds it still waiting is a progress line. Ctrl-C
    stops waiting and leaves the request queued; `forja up` again waits for it once more, and
    `forja down --delete` withdraws it."""
    result = session.run("provision.yml", {**(extravars or {}), "gcp_instance_check": check}, check=False)
    preflight.raise_if_blocking(contract.read_stats(result.artifact_data).preflight)
    return result.raise_for_status()


def configure(session: Session, extravars: Mapping[str, Any] | None = None) -> list[RunResult]:
    """GPU stack, Jupyter, then the autostop guard: playbooks/gpu.yml, jupyter.yml and autostop.yml.

    The guard is configured with Jupyter because it watches Jupyter's kernels: a port moved with
    `-e host_contract_jupyter_port=N` moves the agent too."""
    return [session.run(book, extravars) for book in ("gpu.yml", "jupyter.yml", "autostop.yml")]


def down(
    session: Session, delete: bool = False, extravars: Mapping[str, Any] | None = None,
    plan: deletion.DeletionPlan | None = None,
) -> RunResult:
    """Stop (or delete) the GPU host(s): playbooks/teardown.yml.

    Before a deletion it says what goes (each VM with its boot disk and that disk's monthly cost) and
    what stays (the buckets), as an announcement (`forja down --delete` prints it, and its --json has
    it as `deletion_plan`); `plan` is that plan when the caller made it already (forja.deletion.plan).
    Nothing asks to confirm, so scripts and cron run it as they are."""
    if delete:
        plan = plan or deletion.plan(session, extravars)
        session.fan_out()(ev.Announcement(0, host="forja", text=plan.text()))
    return teardown(session, delete, extravars)


def teardown(session: Session, delete: bool = False, extravars: Mapping[str, Any] | None = None) -> RunResult:
    """playbooks/teardown.yml itself, with nothing said first: for forja's own deletions, such as the
    managed watcher's of a VM Google preempted or took away, where a plan would cost an inventory
    read and a play on the way to the recovery and tell nobody anything they asked for."""
    return session.run("teardown.yml", {**(extravars or {}), "forja_teardown_delete": delete})


def observe(
    session: Session, extravars: Mapping[str, Any] | None = None
) -> dict[str, contract.InstanceState]:
    """The GPU VM as Compute Engine reports it, by name: status, zone, preemptions.

    Runs playbooks/observe.yml (changes nothing); a managed run's watcher calls it every poll.
    """
    return contract.read_stats(session.run("observe.yml", extravars).artifact_data).instances
