"""Replicas on the sandbox's test hosts: each one a process on its own machine, as on Vertex.

Given test hosts (``forja_sandbox.testhosts``, the Deep Learning VM image has PyTorch), the
emulator puts replica ``r`` on host ``r mod len(hosts)`` and reaches it over the host's SSH
(``Host.ssh_argv``): the package folders go there first (one tar stream), then the replica runs
with exactly Vertex's environment (``env -i``: nothing of the emulator's own leaks in) in a folder
of its own under the host's /tmp. Its output comes back over SSH's stdout and stderr, and ssh exits
with the replica's status. The remote shell's pid is written next to it: sshd makes that shell a
session (and process group) leader and ``exec`` keeps its pid, so one ``kill -- -PID`` on the
host stops the replica and every process it started there, which killing the local ssh would not.
"""

from __future__ import annotations

import io
import shlex
import signal
import subprocess
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from forja_sandbox.testhosts import Host

#: Where replicas work on a host (its /tmp, which th-up.sh keeps in the host's own folder).
REMOTE_ROOT = "/tmp/forja-vertex"
#: Vertex gives each replica port 2222 on its own VM; replicas that share a host count up from it.
REPLICA_PORT = 2222
#: The host's network interface (th-up.sh names the inside end of its veth eth0). gloo binds the
#: address its hostname resolves to, which on a test host is 127.0.1.1 (its /etc/hosts): it is
#: told the interface instead (Vertex's VMs resolve their hostname to their own address).
HOST_IFNAME = "eth0"
#: The replica's PATH on the host: the image's, as a container's default.
REMOTE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The host's Python (the Deep Learning VM image's, with its PyTorch) runs a pythonPackageSpec.
REMOTE_PYTHON = "python3"
SSH_TIMEOUT_S = 30.0


def remote_dir(job_id: str, label: str) -> str:
    return f"{REMOTE_ROOT}/{job_id}/{label}"


def ship(host: Host, paths: list[str], where: str) -> list[str]:
    """Copy package folders and wheels to ``where/pkg/<k>/`` on the host; their paths there.

    OSError when the host cannot take them (the job then fails as a replica that could not start).
    """
    buffer = io.BytesIO()
    remote = []
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for k, path in enumerate(Path(p) for p in paths):
            tar.add(str(path), arcname=f"{k}/{path.name}", filter=_no_caches)
            remote.append(f"{where}/pkg/{k}/{path.name}")
    folder = shlex.quote(where)
    script = f"rm -rf {folder} && mkdir -p {folder}/pkg && tar -C {folder}/pkg -x"
    done = subprocess.run(host.ssh_argv(script), input=buffer.getvalue(), capture_output=True,
                          timeout=SSH_TIMEOUT_S, check=False)  # fmt: skip
    if done.returncode != 0:
        raise OSError(
            f"{host.name}: copying the packages failed: {done.stderr.decode(errors='replace').strip()}"
        )
    return remote


def _no_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name.split("/") else info


def replica_argv(host: Host, where: str, command: list[str], env: dict[str, str]) -> list[str]:
    """The local ssh command that runs ``command`` on the host with only ``env`` (and PATH, HOME).
    Output folders given as local paths (a baseOutputDirectory that is no gs:// URI) are made there."""
    variables = {"PATH": REMOTE_PATH, "HOME": where, "GLOO_SOCKET_IFNAME": HOST_IFNAME, **env}
    assigned = " ".join(shlex.quote(f"{k}={v}") for k, v in variables.items())
    run = " ".join(shlex.quote(c) for c in command)
    folders = " ".join(shlex.quote(v) for k, v in env.items() if k.startswith("AIP_") and "://" not in v)
    make = f"mkdir -p {shlex.quote(where)} {folders}"
    return host.ssh_argv(
        f"{make} && cd {shlex.quote(where)} && echo $$ > pid && exec env -i {assigned} {run}"
    )


def signal_replica(host: Host, where: str, sig: signal.Signals) -> None:
    """Send ``sig`` to the replica's process group on the host (nothing if it is gone)."""
    pid = shlex.quote(f"{where}/pid")
    script = f"test -f {pid} && kill -{sig.name.removeprefix('SIG')} -- -$(cat {pid})"
    subprocess.run(host.ssh_argv(script), capture_output=True, timeout=SSH_TIMEOUT_S, check=False)
