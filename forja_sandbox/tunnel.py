"""A real ``ssh -N -L`` tunnel held open while a ``with`` block runs: how the tests, the molecule
verifiers and the benchmarks reach a host's loopback-only Jupyter, as Colab does.

It runs exactly `forja.tunnel.ssh_command`, the command `forja tunnel` prints for people, and adds
what a program needs around it: a refusal when the local port is taken, a wait until the forward
accepts connections (ssh's stderr when it dies first), and the child always ended on exit. It
lives with the sandbox because only tests and benchmarks hold a tunnel open from Python.
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from forja.tunnel import HostKeyPolicy, ssh_command
from forja_sandbox.serving import end_process


class TunnelError(RuntimeError):
    """The tunnel could not be opened; the message carries ssh's own explanation."""


@dataclasses.dataclass(frozen=True)
class Tunnel:
    """An open tunnel: connect to ``127.0.0.1:local_port`` to reach the host's ``remote_port``."""

    local_port: int
    remote_port: int
    process: subprocess.Popen[bytes]

    @property
    def base_url(self) -> str:
        """The URL a browser (or Colab) uses, with ``localhost`` as Colab's docs spell it."""
        return f"http://localhost:{self.local_port}"



def port_is_free(port: int) -> bool:
    """True when nothing on this machine holds 127.0.0.1:port (so a connect would reach our tunnel).

    SO_REUSEADDR, as ssh sets on its forwards: connections of a tunnel closed a moment ago linger
    in TIME_WAIT on the port and must not make it look taken (ssh would bind it fine).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def ssh_tunnel(
    host: str,
    user: str,
    key_file: str | Path | None,
    local_port: int,
    remote_port: int | None = None,
    *,
    port: int = 22,
    strict_host_key_checking: HostKeyPolicy = "accept-new",
    known_hosts_file: str | Path | None = None,
    timeout_s: float = 30.0,
    proxy_command: str | None = None,
) -> Iterator[Tunnel]:
    """Forward ``127.0.0.1:local_port`` to ``127.0.0.1:remote_port`` on ``host`` while the block runs.

    ``remote_port`` defaults to ``local_port``: Colab's http_over_ws path only works with equal
    ports. Returns once the local port accepts connections; raises ``TunnelError`` with ssh's stderr
    if ssh exits first or the port never opens. The ssh process is always ended on exit.
    """
    remote = local_port if remote_port is None else remote_port
    if not port_is_free(local_port):
        raise TunnelError(
            f"local port {local_port} is already in use on 127.0.0.1; a tunnel there would reach "
            "whatever holds it. Stop that process or choose another port."
        )
    argv = ssh_command(
        host, user, key_file, local_port, remote, port=port,
        strict_host_key_checking=strict_host_key_checking, known_hosts_file=known_hosts_file,
        proxy_command=proxy_command,
    )
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            _wait_until_open(proc, local_port, timeout_s, stderr)
            yield Tunnel(local_port, remote, proc)
        finally:
            end_process(proc, grace_s=5)


def _wait_until_open(
    proc: subprocess.Popen[bytes], local_port: int, timeout_s: float, stderr: IO[bytes]
) -> None:
    """Poll the local port; if ssh dies first, its stderr is the explanation the user needs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            stderr.seek(0)
            said = stderr.read().decode(errors="replace").strip() or "(no message)"
            raise TunnelError(f"ssh exited with status {proc.returncode} before the tunnel opened: {said}")
        try:
            with socket.create_connection(("127.0.0.1", local_port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise TunnelError(f"the tunnel's local port {local_port} did not open within {timeout_s:.0f} s")
