"""The tunnel that `Forja.tunnel` (``forja tunnel``) hands to a person: the ``ssh -N -L`` command and
the Colab URL.

The Jupyter server on the VM listens on 127.0.0.1 alone; Colab reaches it through an SSH local
forward. Safety choices of the command: ``BatchMode`` (never hang on a password or host-key
prompt), ``ExitOnForwardFailure`` (a port that cannot be forwarded is an error, not a silent tunnel
to nowhere), the local end bound to 127.0.0.1 only. The tests open the same command as a context
manager (`forja_sandbox.tunnel.ssh_tunnel`), so what they exercise is what users run.
"""

from __future__ import annotations

import dataclasses
import subprocess
import threading
from pathlib import Path
from typing import Literal

HostKeyPolicy = Literal["yes", "accept-new", "no"]


def ssh_command(
    host: str,
    user: str,
    key_file: str | Path | None,
    local_port: int,
    remote_port: int,
    *,
    port: int = 22,
    strict_host_key_checking: HostKeyPolicy = "accept-new",
    known_hosts_file: str | Path | None = None,
    connect_timeout_s: int = 10,
    proxy_command: str | None = None,
) -> list[str]:
    """The exact ``ssh`` argv that ``ssh_tunnel`` runs (pure, so it can be shown and tested).

    ``proxy_command`` is ssh's ProxyCommand, e.g. an IAP tunnel to the instance (``%p`` is the port).
    """
    argv = [
        "ssh", "-N",
        "-o", "BatchMode=yes",
        "-o", "ExitOnForwardFailure=yes",
        "-o", f"StrictHostKeyChecking={strict_host_key_checking}",
        "-o", f"ConnectTimeout={connect_timeout_s}",
        "-o", "ServerAliveInterval=15",
        "-o", "LogLevel=ERROR",
        "-p", str(port),
    ]
    if known_hosts_file is not None:
        argv += ["-o", f"UserKnownHostsFile={known_hosts_file}"]
    if key_file is not None:
        argv += ["-i", str(key_file), "-o", "IdentitiesOnly=yes"]
    if proxy_command:
        argv += ["-o", f"ProxyCommand={proxy_command}"]
    argv += ["-L", f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}", f"{user}@{host}"]
    return argv


@dataclasses.dataclass(frozen=True)
class TunnelPlan:
    """The tunnel command for one host and the URL Colab needs (the token only when asked)."""

    host: str
    command: list[str]
    local_port: int
    remote_port: int
    colab_url: str
    token_file: str
    #: The runs' live metrics ports the command forwards too, each to the same local port (`forja top`).
    metrics_ports: tuple[int, ...] = ()

    def open(self, stop: threading.Event | None = None) -> int:
        """Run the tunnel in the foreground until it ends (Ctrl-C or `stop` closes it); ssh's exit status."""
        with subprocess.Popen(self.command) as proc:
            try:
                while proc.poll() is None:
                    if stop is not None and stop.wait(0.5):
                        proc.terminate()
                    elif stop is None:
                        proc.wait()
            finally:
                if proc.poll() is None:
                    proc.terminate()
            return proc.wait()

