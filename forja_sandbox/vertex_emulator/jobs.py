"""CustomJobs held in memory, each driven through Vertex's JobState by its own thread.

Every replica of every worker pool is a real local process (no VM, no image): a pythonPackageSpec
runs ``python -m <pythonModule> <args>`` with its packages importable, a containerSpec runs its
``command + args`` as a plain command. Each gets the environment Vertex gives a replica
(CLUSTER_SPEC, the AIP_* output folders, and PyTorch's MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK),
with every address on 127.0.0.1 and a port of its own. The job ends as Vertex's does: SUCCEEDED
when the primary replica (workerpool0, replica 0) exits 0 and no replica failed, FAILED when a
replica exits non-zero (the others are stopped), CANCELLED after a cancel stops them all.

Given test hosts, each replica runs on one of them over SSH instead (hosts.py); without, on
this machine.

Each line a replica writes becomes a Cloud Logging entry (cloud_logging.LogStore: resource
``ml_job``, its ``task_name``; stdout INFO, stderr ERROR) as it is written, and goes to the
replica's log file too. The job reaches its final state only after its replicas' output is read to
the end (bounded), so a client that reads the logs once the job is over gets every line.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from google.cloud.aiplatform_v1.types import CustomJob, JobState, WorkerPoolSpec
from google.protobuf import timestamp_pb2
from google.rpc import status_pb2

from forja_sandbox.storage_emulator import free_port

from . import hosts as remote
from .cloud_logging import LogStore
from .errors import failed_precondition, not_found

if TYPE_CHECKING:
    from forja_sandbox.testhosts import Host

#: Seconds a job stays QUEUED, then PENDING, so a client polling sees Vertex's order of states.
STEP_S = 0.05
#: After the primary replica succeeds, how long the others get to exit on their own.
PEERS_GRACE_S = 10.0
#: After SIGTERM (cancel, failure, timeout), how long a replica gets before SIGKILL.
STOP_GRACE_S = 3.0
#: After the replicas are gone, how long their output may take to be read to the end (a process
#: they started in a session of its own may hold the pipe open for ever).
DRAIN_S = 2.0
#: Vertex's first job ids are large numbers; the emulator counts up from one of that size.
_IDS = itertools.count(1_000_000_000_000_000_000)
TERMINAL = {
    JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED,
}  # fmt: skip


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def _status(code: int, message: str) -> status_pb2.Status:
    return status_pb2.Status(code=code, message=message)


@dataclass
class Replica:
    """One process of one worker pool: ``workerpool<pool>-<index>`` in Vertex's logs."""

    pool: int
    index: int
    rank: int
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    #: The test host it runs on (None: this machine), its address, and its folder there.
    host: Host | None = None
    address: str = "127.0.0.1"
    remote_dir: str = ""
    #: The threads turning its stdout and stderr into log lines and entries.
    pumps: list[threading.Thread] = field(default_factory=list)
    #: What it runs, kept to start it again when Vertex would restart it (a lost VM).
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None
    #: Its working folder (its own, as each Vertex replica has its own machine); a restart empties it.
    cwd: Path | None = None
    restarts: int = 0

    @property
    def label(self) -> str:
        return f"workerpool{self.pool}-{self.index}"


@dataclass
class Job:
    """A CustomJob (Google's message, the answer to get/list) plus the emulator's bookkeeping."""

    proto: CustomJob
    region: str
    folder: Path
    logs: LogStore
    hosts: tuple[Host, ...] = ()
    replicas: list[Replica] = field(default_factory=list)
    #: Package URIs already pip-installed into ``folder/packages`` (replicas share one install).
    installed: set[str] = field(default_factory=set)
    #: Image URI -> its entrypoint: the images this emulator "has" (it pulls none; see its README).
    images: Mapping[str, Sequence[str]] = field(default_factory=dict)
    #: Labels of replicas whose machine failed (JobStore.fail_replica), for the driver to restart.
    lost: set[str] = field(default_factory=set)
    cancel_asked: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> CustomJob:
        with self.lock:
            return CustomJob(CustomJob.pb(self.proto).__deepcopy__())

    def set_state(self, state: JobState, error: status_pb2.Status | None = None) -> None:
        with self.lock:
            if self.proto.state == JobState.JOB_STATE_CANCELLING and state not in TERMINAL:
                return  # a cancel arrived meanwhile: the driver sees it at its next step
            self.proto.state = state
            now = _now()
            self.proto.update_time = now
            if state == JobState.JOB_STATE_RUNNING:
                self.proto.start_time = now
            if state in TERMINAL:
                self.proto.end_time = now
            if error is not None:
                CustomJob.pb(self.proto).error.CopyFrom(error)


class JobStore:
    """All jobs of one emulator, by full resource name, in creation order."""

    def __init__(
        self, work_dir: Path, logs: LogStore, hosts: tuple[Host, ...] = (),
        images: Mapping[str, Sequence[str]] | None = None,
    ) -> None:  # fmt: skip
        self.work_dir = work_dir
        self.logs = logs
        self.hosts = hosts
        self.images = dict(images or {})
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def create(self, project: str, region: str, proto: CustomJob) -> CustomJob:
        job_id = str(next(_IDS))
        name = f"projects/{project}/locations/{region}/customJobs/{job_id}"
        for output in ("name", "state", "create_time", "start_time", "end_time", "update_time", "error"):
            delattr(proto, output)  # output-only fields: whatever the client sent is ignored
        proto.name = name
        proto.state = JobState.JOB_STATE_QUEUED
        proto.create_time = proto.update_time = _now()
        job = Job(proto=proto, region=region, folder=self.work_dir / "jobs" / job_id, logs=self.logs,
                  hosts=self.hosts, images=self.images)  # fmt: skip
        job.folder.mkdir(parents=True)
        with self._lock:
            self._jobs[name] = job
        threading.Thread(target=_drive, args=(job,), name=f"vertex-job-{job_id}", daemon=True).start()
        return job.snapshot()

    def job(self, name: str) -> Job:
        with self._lock:
            found = self._jobs.get(name)
        if found is None:
            raise not_found(f'CustomJob "{name}"')
        return found

    def list(self, parent: str) -> list[Job]:
        with self._lock:
            return [j for n, j in self._jobs.items() if n.startswith(parent + "/customJobs/")]

    def cancel(self, name: str) -> None:
        job = self.job(name)
        with job.lock:
            state = job.proto.state
            if state in TERMINAL or state == JobState.JOB_STATE_CANCELLING:
                raise failed_precondition(
                    f"Cannot cancel the CustomJob {name}: it is in state {JobState(state).name}."
                )
            job.proto.state = JobState.JOB_STATE_CANCELLING
            job.proto.update_time = _now()
        job.cancel_asked.set()

    def fail_replica(self, name: str, label: str) -> None:
        """The machine of one replica fails (a host error, a lost VM): its processes are killed at
        once and, as Vertex does, the replica is started again on a fresh disk; with the job's
        ``scheduling.restartJobOnWorkerRestart`` every replica is restarted with it. Not an API
        call: a test's stand-in for Google's side of a failure (Vertex has no call for it)."""
        job = self.job(name)
        if label not in {r.label for r in job.replicas}:
            raise not_found(f'replica "{label}" of CustomJob "{name}"')
        with job.lock:
            job.lost.add(label)

    def stop_all(self, timeout: float = STOP_GRACE_S + 2) -> None:
        """Cancel every job still going and wait for its processes (the emulator is stopping)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            with contextlib.suppress(Exception):
                self.cancel(job.proto.name)
        for job in jobs:
            job.done.wait(timeout)


# -- one job's life ----------------------------------------------------------------------------
def _drive(job: Job) -> None:
    try:
        _run(job)
    except Exception as exc:  # the emulator's own bug: the job fails visibly, not silently
        _stop_replicas(job)
        job.set_state(JobState.JOB_STATE_FAILED, _status(13, f"Internal error in the emulator: {exc!r}"))
    finally:
        job.done.set()


def _run(job: Job) -> None:
    if job.cancel_asked.wait(STEP_S):
        return _cancelled(job)
    job.set_state(JobState.JOB_STATE_PENDING)
    if job.cancel_asked.wait(STEP_S):
        return _cancelled(job)
    try:
        _start_replicas(job)
    except (OSError, subprocess.CalledProcessError) as exc:
        _stop_replicas(job)
        detail = (
            exc.stderr.decode(errors="replace") if isinstance(exc, subprocess.CalledProcessError) else exc
        )
        return job.set_state(JobState.JOB_STATE_FAILED, _status(3, f"A replica could not start: {detail}"))
    job.set_state(JobState.JOB_STATE_RUNNING)
    spec = job.proto.job_spec
    timeout = spec.scheduling.timeout if "scheduling" in spec else None
    timeout_s = timeout.total_seconds() if timeout else 0
    deadline = time.monotonic() + timeout_s if timeout_s else None
    primary = job.replicas[0]
    while not job.cancel_asked.wait(STEP_S):
        _restart_lost(job)
        failed = next((r for r in job.replicas if r.proc and r.proc.poll() not in (None, 0)), None)
        if failed is not None:
            _stop_replicas(job)
            message = f"The replica {failed.label} exited with a non-zero status of {failed.proc.returncode}."  # type: ignore[union-attr]
            return job.set_state(JobState.JOB_STATE_FAILED, _status(3, message))
        if primary.proc and primary.proc.poll() == 0:
            _wait_peers(job)
            return job.set_state(JobState.JOB_STATE_SUCCEEDED)
        if deadline is not None and time.monotonic() > deadline:
            _stop_replicas(job)
            message = f"The job ran longer than its timeout of {timeout_s:g} s."
            return job.set_state(JobState.JOB_STATE_FAILED, _status(4, message))
    return _cancelled(job)


def _cancelled(job: Job) -> None:
    _stop_replicas(job)
    job.set_state(JobState.JOB_STATE_CANCELLED, _status(1, "CANCELED"))


def _wait_peers(job: Job) -> None:
    """The primary is done: the others get PEERS_GRACE_S to finish, then are stopped."""
    deadline = time.monotonic() + PEERS_GRACE_S
    while time.monotonic() < deadline and any(r.proc and r.proc.poll() is None for r in job.replicas):
        time.sleep(STEP_S)
    _stop_replicas(job)


def _stop_replicas(job: Job) -> None:
    """SIGTERM every replica's process group, SIGKILL what is left after STOP_GRACE_S."""
    _stop(job, job.replicas)


def _stop(job: Job, replicas: list[Replica]) -> None:
    """SIGTERM these replicas' process groups, SIGKILL what is left after STOP_GRACE_S; their
    output read to the end."""
    running = [r for r in replicas if r.proc and r.proc.poll() is None]
    for replica in running:
        _signal(replica, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for replica in running:
        assert replica.proc is not None
        try:
            replica.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(replica, signal.SIGKILL, tree=True)
            replica.proc.wait()
    deadline = time.monotonic() + DRAIN_S
    for pump in (p for r in replicas for p in r.pumps):
        pump.join(max(0.0, deadline - time.monotonic()))


def _restart_lost(job: Job) -> None:
    """Replicas whose machine failed start again, on a fresh working folder: every replica when
    the job asks for it (restartJobOnWorkerRestart; the others are stopped first), else only those."""
    with job.lock:
        lost, job.lost = set(job.lost), set()
    if not lost:
        return
    spec = job.proto.job_spec
    everyone = "scheduling" in spec and spec.scheduling.restart_job_on_worker_restart
    again = job.replicas if everyone else [r for r in job.replicas if r.label in lost]
    for replica in (r for r in again if r.label in lost and r.proc and r.proc.poll() is None):
        _signal(replica, signal.SIGKILL, tree=True)  # its machine is gone: nothing gets to save
    _stop(job, again)
    for replica in again:
        replica.restarts += 1
        job.logs.append(job.proto.name.split("/")[1], job.proto.name.rsplit("/", 1)[1], replica.label,
                        f"The replica {replica.label} is restarted (restart {replica.restarts}).", True)
        _launch(job, replica)


def _signal(replica: Replica, sig: signal.Signals, tree: bool = False) -> None:
    """The replica's process group: on its test host (there, then the local ssh on SIGKILL), or here;
    with ``tree``, every process below it too (torchrun's workers lead sessions of their own, which a
    signal to the group misses; a machine that fails takes them all)."""
    assert replica.proc is not None
    if tree and replica.host is None:
        for pid in _descendants(replica.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    if replica.host is not None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            remote.signal_replica(replica.host, replica.remote_dir, sig)
        if sig != signal.SIGKILL:
            return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(replica.proc.pid, sig)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc (their parent ids)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _pump(job: Job, replica: Replica, stream: IO[bytes], stderr: bool) -> None:
    """One output stream of one replica, line by line, into its log file and Cloud Logging."""
    project, job_id = job.proto.name.split("/")[1], job.proto.name.rsplit("/", 1)[1]
    with stream, replica.log.open("ab", buffering=0) as log:
        for raw in iter(stream.readline, b""):
            log.write(raw)
            text = raw.decode(errors="replace").rstrip("\r\n")
            job.logs.append(project, job_id, replica.label, text, stderr)


# -- replicas ------------------------------------------------------------------------------------
class ImageNotPulled(OSError):
    """A container whose image the emulator does not have and whose command is not given."""


def replica_command(pool: WorkerPoolSpec, images: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """What one replica of ``pool`` runs: the package's module with this Python, or the container's
    command, else its image's entrypoint as the emulator was given it (it pulls no image)."""
    if "python_package_spec" in pool:
        spec = pool.python_package_spec
        return [sys.executable, "-m", spec.python_module, *spec.args]
    spec = pool.container_spec
    entrypoint = list(spec.command) or list((images or {}).get(spec.image_uri, ()))
    if not entrypoint:
        raise ImageNotPulled(
            f"Unable to pull the image {spec.image_uri}: the sandbox pulls and runs no images; give the "
            "container a command, or the emulator the image's entrypoint (VertexEmulator(images={URI: "
            "[COMMAND, ...]}), --image URI=COMMAND)."
        )
    return [*entrypoint, *spec.args]


def package_path(uri: str) -> Path:
    """A package URI as a local path (``file://`` or a plain path; validation refused the rest)."""
    return Path(uri.removeprefix("file://")).resolve()


def download_package(job: Job, uri: str) -> Path:
    """A ``gs://BUCKET/OBJECT`` package, fetched from the sandbox's Cloud Storage (google-cloud-storage
    reads STORAGE_EMULATOR_HOST) into the job's folder, once per job; a missing object raises OSError,
    which fails the job as a replica that could not start."""
    from google.api_core import exceptions as api_exceptions
    from google.cloud import storage

    bucket, _, name = uri.removeprefix("gs://").partition("/")
    dest = job.folder / "downloads" / name.rsplit("/", 1)[-1]
    if not dest.is_file():
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            storage.Client(project="forja-sandbox").bucket(bucket).blob(name).download_to_filename(str(dest))
        except api_exceptions.GoogleAPICallError as exc:
            dest.unlink(missing_ok=True)
            raise OSError(f"{uri}: {exc}") from None
    return dest


def _python_path(job: Job, pool: WorkerPoolSpec) -> list[str]:
    """Folders and wheels to import the pool's packages from; an sdist (local, or downloaded from
    gs://) is pip-installed first, once per job, into the job's folder (``--no-deps``: the
    replicas use the emulator's own Python, which has what the packages need)."""
    if "python_package_spec" not in pool:
        return []
    paths = []
    for uri in pool.python_package_spec.package_uris:
        path = download_package(job, uri) if uri.startswith("gs://") else package_path(uri)
        if path.is_dir() or path.suffix in (".whl", ".zip"):
            paths.append(str(path))
            continue
        target = job.folder / "packages"
        if uri not in job.installed:
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                 "--no-build-isolation", "--disable-pip-version-check", "--target", str(target), str(path)],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            _install_requirements(target)
            job.installed.add(uri)
        paths.append(str(target))
    return paths


def _install_requirements(target: Path) -> None:
    """The installed packages' own requirements that the emulator's Python lacks, pip-installed into
    ``target`` (from the index pip is configured with). A requirement that is installed at another
    version is used as it is: the replicas share the emulator's Python (see its README)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    missing = []
    for dist in metadata.distributions(path=[str(target)]):
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                metadata.distribution(req.name)
            except metadata.PackageNotFoundError:
                missing.append(str(req))
    if missing:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target",
             str(target), *sorted(set(missing))],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip


def output_dirs(job: Job) -> dict[str, str]:
    """AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR under baseOutputDirectory, as
    Vertex sets them (``<prefix>/model/`` ...); a local prefix gets the folders made, here (on test
    hosts, each replica's command makes them there: hosts.replica_argv)."""
    prefix = job.proto.job_spec.base_output_directory.output_uri_prefix
    if not prefix:
        return {}
    dirs = {
        "AIP_MODEL_DIR": "model/",
        "AIP_CHECKPOINT_DIR": "checkpoints/",
        "AIP_TENSORBOARD_LOG_DIR": "logs/",
    }
    out = {k: f"{prefix.rstrip('/')}/{v}" for k, v in dirs.items()}
    if "://" not in prefix and not job.hosts:
        for folder in out.values():
            Path(folder).mkdir(parents=True, exist_ok=True)
    return out


def _start_replicas(job: Job) -> None:
    pools = list(job.proto.job_spec.worker_pool_specs)
    job_id = job.proto.name.rsplit("/", 1)[1]
    rank = 0
    for p, pool in enumerate(pools):
        for i in range(pool.replica_count):
            replica = Replica(p, i, rank, 0, job.folder / f"workerpool{p}-{i}.log")
            if job.hosts:  # round robin; a second replica on one host takes the next port
                replica.host = job.hosts[rank % len(job.hosts)]
                replica.address = replica.host.address
                replica.port = remote.REPLICA_PORT + sum(r.host == replica.host for r in job.replicas)
                replica.remote_dir = remote.remote_dir(job_id, replica.label)
            else:
                replica.port = free_port()
            job.replicas.append(replica)
            rank += 1
    cluster = {
        f"workerpool{p}": [f"{r.address}:{r.port}" for r in job.replicas if r.pool == p]
        for p in range(len(pools))
        if pools[p].replica_count
    }
    job_json = json.loads(type(job.proto.job_spec).to_json(job.proto.job_spec, indent=0))
    common = {
        "CLOUD_ML_JOB_ID": job_id,
        "CLOUD_ML_REGION": job.region,
        "MASTER_ADDR": job.replicas[0].address,
        "MASTER_PORT": str(job.replicas[0].port),
        "WORLD_SIZE": str(len(job.replicas)),
        **output_dirs(job),
    }
    for replica in job.replicas:
        pool = pools[replica.pool]
        spec = pool.python_package_spec if "python_package_spec" in pool else pool.container_spec
        env = {**common, **{e.name: e.value for e in spec.env}}
        env["RANK"] = str(replica.rank)
        env["CLUSTER_SPEC"] = json.dumps({
            "cluster": cluster,
            "environment": "cloud",
            "task": {"type": f"workerpool{replica.pool}", "index": replica.index},
            "job": job_json,
        })  # fmt: skip
        extra = _python_path(job, pool)
        command = replica_command(pool, job.images)
        if replica.host is not None:
            extra = remote.ship(replica.host, extra, replica.remote_dir) if extra else []
            if "python_package_spec" in pool:
                command[0] = remote.REMOTE_PYTHON
        else:
            env = {**os.environ, **env}
        if extra:
            env["PYTHONPATH"] = os.pathsep.join([*extra, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        replica.argv = command
        if replica.host is not None:
            replica.argv = remote.replica_argv(replica.host, replica.remote_dir, command, env)
        replica.env = env if replica.host is None else None
        replica.cwd = job.folder / replica.label
        replica.log.write_bytes(b"")
        _launch(job, replica)


def _launch(job: Job, replica: Replica) -> None:
    """Start (or start again) one replica in its own empty working folder, its output pumped."""
    assert replica.cwd is not None
    shutil.rmtree(replica.cwd, ignore_errors=True)
    replica.cwd.mkdir(parents=True)
    replica.proc = proc = subprocess.Popen(
        replica.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=replica.env, cwd=replica.cwd, start_new_session=True,
    )  # fmt: skip
    for stream, is_err in ((proc.stdout, False), (proc.stderr, True)):
        assert stream is not None
        pump = threading.Thread(target=_pump, args=(job, replica, stream, is_err), daemon=True,
                                name=f"vertex-log-{replica.label}")  # fmt: skip
        pump.start()
        replica.pumps.append(pump)
