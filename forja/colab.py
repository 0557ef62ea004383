"""Colab's way in: the SSH tunnel to a host's Jupyter, held open across stops, preemptions and moves.

Why apart from `forja.tunnel`: that module is the tunnel itself (`TunnelPlan`: ssh's argv, the URL
to paste into Colab), which the host contract builds from what the jupyter_colab role publishes;
this one asks the hosts for it through a playbook, starts a stopped VM when told, and plans the
tunnel again when the VM comes back somewhere else.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from forja import contract, errors, inventory, lifecycle
from forja import events as ev
from forja.session import Session
from forja.tunnel import TunnelPlan


def tunnel(
    session: Session,
    host: str | None = None,
    local_port: int | None = None,
    *,
    gcloud: bool = False,
    show_token: bool = False,
    start: bool = False,
) -> TunnelPlan:
    """The SSH tunnel to a host's Jupyter and the URL to paste into Colab (`TunnelPlan.open()` runs it).

    `host` is an inventory host of forja_gpu (None: the first). Both ends use the port the host's
    Jupyter serves, as the role publishes it (`jupyter()`): Colab needs them equal.
    A stopped VM raises `HostStopped` (exit 6) saying since when and why; `start=True` starts it
    first (playbooks/provision.yml, as `up()` does), announced to the listeners as `HostStarting`.
    """
    chosen = session.gpu_host(host)
    if chosen.stopped and start:
        session.fan_out()(ev.HostStarting(0, host=chosen.name, status=chosen.status or "stopped",
                                          playbook="provision.yml"))
        lifecycle.up(session)
        chosen = session.gpu_host(host)
    if chosen.stopped:
        raise inventory.stopped_error(chosen)
    connection = jupyter(session, chosen.name, gcloud=gcloud)[chosen.name]
    return connection.plan(chosen.name, local_port, show_token)


def keep_tunnel(
    session: Session,
    host: str | None = None,
    local_port: int | None = None,
    *,
    gcloud: bool = False,
    retry_s: float = 10.0,
    say: Callable[[str], None] = print,
    stop: threading.Event | None = None,
    plan: TunnelPlan | None = None,
) -> None:
    """Hold the Colab tunnel open across stop/start, preemption and zone moves, on one local port.

    The first plan must work (a wrong --host or a stopped VM is said at once). After that, when
    ssh ends (the VM went away), the tunnel is planned again every `retry_s` seconds, each try
    announced, until the VM answers again: at its new address, in its new zone; the local port
    and the token stay the same (jupyter_colab gives a new VM the controller's token), so Colab
    only needs the cell run again. Returns when `stop` is set (Ctrl-C ends it in the CLI).
    `plan`: the first plan, when the caller made it already (to show it).
    """
    stop = stop or threading.Event()
    plan = plan or tunnel(session, host, local_port, gcloud=gcloud)
    local_port = plan.local_port
    while not stop.is_set():
        say(f"tunnel open on 127.0.0.1:{local_port} to {plan.host}")
        rc = plan.open(stop)
        if stop.is_set():
            return
        say(f"tunnel to {plan.host} closed (ssh exit {rc}); opening it again when the VM answers")
        while not stop.wait(retry_s):
            try:
                plan = tunnel(session, host or plan.host, local_port, gcloud=gcloud)
                break
            except errors.ForjaError as exc:
                say(f"not yet ({exc.message.splitlines()[0][:160]}); next try in {retry_s:.0f} s")


def jupyter(
    session: Session, host: str | None = None, *, gcloud: bool = False
) -> dict[str, contract.JupyterConnection]:
    """How to reach each host's Jupyter from Colab, as the jupyter_colab role publishes it.

    Runs playbooks/jupyter_connection.yml (changes nothing on the host): the port is the one the
    host's Jupyter serves, the tunnel command ssh along Ansible's own path to the host (through
    IAP in iap mode, as the firewall admits), or gcloud compute ssh when `gcloud`; the token is
    copied to this machine again, never published.
    """
    extravars: dict[str, Any] = {"forja_hosts": host} if host else {}
    if gcloud:
        extravars["jupyter_colab_tunnel_style"] = "gcloud"
    result = session.run("jupyter_connection.yml", extravars)
    found = contract.read_stats(result.artifact_data).jupyter
    if host and host not in found:
        raise errors.ConfigError("--host", f"{host} has no Jupyter connection; run `forja configure`")
    return found
