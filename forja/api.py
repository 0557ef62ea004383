"""The forja Python API: provision, configure, train, follow, fetch and stop, as typed calls.

    from forja.api import Forja
    f = Forja(project_dir="~/my-project", inventory="inventory/sandbox")
    f.up(); f.configure()
    result = f.train("trainer/configs/digits.yaml")      # streams, follows to the end, fetches
    print(result.summary["final_loss"], result.artifact_dir)
    run = f.train(script="train.py", args=["--lr", "3e-4"], wait=False)   # your own script, detached
    f.follow(run.run_id)                                  # pick it up again: hours or days later
    print(f.tunnel().colab_url, f.cost().lines[0].usd_per_hour)
    stream = f.iter_events("status")                      # events as they happen, then the result
    for item in stream: ...                               # stream.cancel() stops this call only
    f.down()

Every verb of the `forja` command calls one of these methods; the docstrings are for Python callers,
and the command's help is its own, in the command line's terms (forja/cli). Every method
runs one of the repository's playbooks through `forja.runner` (real Ansible, no shortcuts), returns
frozen dataclasses and raises the typed errors of `forja.errors` carrying the failing host, task and
message. Every training run is recorded in `forja.history` before it starts, so a run that fails, is
cancelled or preempted is marked as such, never lost.

Why a facade of one-line delegations: each verb lives in the module named for what it does (its
docstring there is the one `help(Forja.verb)` shows), as a function over a `forja.session.Session`;
`Forja` is that session with every verb as a method, so a user needs one import and one object,
and no feature needs to import this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from forja import (
    again,
    colab,
    cost_report,
    datasets,
    following,
    hub,
    lifecycle,
    live,
    managed,
    plan,
    preflight,
    prune,
    queue,
    snapshot,
    sweep,
    training,
    vertex,
    zones,
)
from forja.cost_report import CostReport
from forja.runs import RUN_NAME, TrainResult, TrainStatus, how_to_follow
from forja.session import FOLLOW_WINDOW_S, POLL_S, Session
from forja.ui import DEFAULT_PORT

__all__ = ["FOLLOW_WINDOW_S", "POLL_S", "RUN_NAME", "CostReport", "Forja", "TrainResult", "TrainStatus",
           "how_to_follow"]


class Forja(Session):
    __doc__ = Session.__doc__

    # -- the hosts' lifecycle (forja.lifecycle) and the managed watcher (forja.managed) ----------
    check = preflight.check
    zones = zones.zones
    up = lifecycle.up
    configure = lifecycle.configure
    down = lifecycle.down
    observe = lifecycle.observe
    prune = prune.prune
    watch = managed.watch
    train_managed = managed.train_managed

    # -- training (forja.training), and the run on its hosts (forja.following) -------------------
    train = training.train
    follow = following.follow
    status = following.status
    logs = following.logs
    follow_logs = following.follow_logs
    fetch = following.fetch_run
    stop = following.stop
    runs = following.runs
    live = staticmethod(live.samples)
    run_snapshot = snapshot.load  # what a run ran (forja.snapshot): `forja runs --show`, `train --again`
    train_again = again.train_again  # `forja train --again RUN` (forja.again), on the VM or Vertex AI
    train_managed_again = again.train_managed_again  # ... with --managed

    # -- the run queue on each VM (forja.queue) ------------------------------------------------------
    queue_cancel = queue.cancel
    queue_move = queue.move
    queue = queue.queue  # last: from here on, `queue` in this class body is the verb, not the module

    # -- hyperparameter sweeps with Optuna, each trial a run (forja.sweep) ----------------------
    sweep_resume = sweep.resume
    sweep_status = sweep.status
    sweep = sweep.sweep  # last: from here on, `sweep` in this class body is the verb, not the module

    # -- elsewhere: Vertex AI (forja.vertex), the Hub (forja.hub), the bucket (forja.datasets) ---
    vertex_follow = vertex.follow_run
    vertex_cancel = vertex.cancel_run
    model_push = hub.model_push
    push_data = datasets.push

    # -- Colab's tunnel (forja.colab), the bill (forja.cost_report), the dashboard (forja.ui) ----
    tunnel = colab.tunnel
    keep_tunnel = colab.keep_tunnel
    jupyter = colab.jupyter
    cost = cost_report.cost
    rate = cost_report.rate
    run_cost = cost_report.run_cost
    estimate = cost_report.estimate
    plan = plan.plan

    def ui(
        self,
        *,
        port: int = DEFAULT_PORT,
        token: str | None = None,
        metrics_urls: Sequence[str] | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        """Serve a local web dashboard until Ctrl-C: the runs of the history with their status, cost,
        preemptions and zone moves; each serving run's live metrics as charts (through the tunnel, as
        `forja top` reads them); each run's cost part by part and its final plots; the VMs' state and
        spend. It listens on 127.0.0.1 only and asks for a token, as Jupyter does: a random one per
        start (or `token`, or $FORJA_UI_TOKEN), in the URL printed once (`say`); the page then keeps
        it in the tab (sessionStorage, never a cookie). `port` 0 takes any free port; `metrics_urls`
        replaces the metrics ports' URLs.
        """
        from forja.ui.server import serve  # Starlette and uvicorn load only for the dashboard

        serve(self, port=port, token=token, metrics_urls=metrics_urls, say=say)
