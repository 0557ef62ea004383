"""`VertexEmulator`: the object tests and the sandbox hold, a context manager like the others.

It binds a loopback HTTP port at construction (so ``url`` is known at once), serves on a background
thread after ``start()``, and on ``stop()`` cancels every job still going, so no replica process
outlives it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..emulator_http import EmulatorService
from .cloud_logging import LogStore
from .jobs import Job, JobStore
from .server import VertexHTTPServer

if TYPE_CHECKING:
    from forja_sandbox.testhosts import Host


class VertexEmulator(EmulatorService):
    """A local Vertex AI API (CustomJob create/get/list/cancel) on a real loopback HTTP port, with
    Cloud Logging's ``entries:list`` for the replicas' output on the same port.

    ``work_dir`` holds each job's replica logs (``jobs/<id>/workerpool<p>-<i>.log``) and installed
    packages; None: a temporary folder, removed on stop. ``hosts``: test hosts (booted, e.g. by
    ``testhosts.up(N, image="dlvm")``) the replicas run on, round robin; none: local processes.
    ``images``: image URI -> its entrypoint, what a ``containerSpec`` without a command runs (the
    emulator pulls no image; one it is not given fails the job as an image Vertex cannot pull).
    ``url`` is the value for the client's ``api_endpoint``, Vertex's and Logging's.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        work_dir: Path | None = None,
        hosts: tuple[Host, ...] = (),
        images: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="forja-vertex-")).resolve()
        #: The replicas' output as Cloud Logging entries, served on the same port (``v2/entries:list``).
        self.logs = LogStore()
        self.store = JobStore(self.work_dir, self.logs, tuple(hosts), images)
        self._server = VertexHTTPServer((host, port), self)
        self.host = host
        self.port = int(self._server.server_address[1])

    def stop(self) -> None:
        """Cancel what runs, stop serving, release the port (and the temporary folder)."""
        self.store.stop_all()
        super().stop()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def job(self, name: str) -> Job:
        """The emulator's record of a job (its replicas' processes and logs), for tests."""
        return self.store.job(name)

    def fail_replica(self, name: str, label: str) -> None:
        """The machine of replica ``label`` (``workerpool1-0``) of job ``name`` fails; Vertex restarts
        it (and, with restartJobOnWorkerRestart, every replica): jobs.JobStore.fail_replica."""
        self.store.fail_replica(name, label)
