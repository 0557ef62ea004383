"""`forja train CONFIG --backend vertex`: one training run as a Vertex AI custom job.

Why it is built this way:

* What runs is a Python source distribution, the form Vertex's ``pythonPackageSpec`` pip-installs:
  the trainer package with the run's config inside it (as the trainer's built-in config
  ``forja_vertex_run``), built by setuptools' own ``build_meta`` (no hand-made tarball), stored
  under the hash of what goes in (``gs://BUCKET/vertex/packages/<hash>/...``), so a second run of
  the same trainer and config builds and uploads nothing.
* The job goes through the one Vertex client, ``plugins/module_utils/forja_vertex.py`` (the
  forja.gpu.vertex_custom_job module's), loaded by path (forja/module_utils.py): the same body,
  the same machine-catalog check, the same states.
* Results land in the bucket: the trainer mirrors its checkpoints, logs and model to
  ``gs://BUCKET/vertex/runs/<run>/`` (its ``checkpoint_bucket``, the run named by ``FORJA_RUN``),
  which is also the job's ``baseOutputDirectory``, so Vertex's ``AIP_MODEL_DIR`` is where the
  trainer's ``model/`` goes. A completed run's logs and model come back to
  ``<project>/forja-runs/<run>/vertex/``.
* Bad input (no bucket, no project, a machine without that accelerator) fails before anything is
  built or sent. Following never cancels: Ctrl-C, ``wait=False`` or a timeout only stop watching.
* Following streams the replicas' output from Cloud Logging, where Vertex writes it (resource
  ``ml_job``), each line said with its replica's ``task_name``. Which lines are new is decided by
  the entries' own timestamps and insertIds, never by this machine's clock, and each poll looks
  back LOG_LOOKBACK_S (by those timestamps) for lines Logging ingested late. A log that cannot be
  read is said once and the job is still followed to its end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import yaml

from forja import errors, module_utils, trainer_config
from forja import events as ev
from forja.cost.spend import parse_time  # RFC 3339, any fraction (Logging writes nine digits)

if TYPE_CHECKING:
    from forja.api import TrainResult

#: Vertex's own default region (the aiplatform SDK's): it offers every GPU forja's catalog knows.
DEFAULT_REGION = "us-central1"
#: A prebuilt Vertex AI training image for PyTorch on GPUs (Google's list: "Prebuilt containers for
#: custom training"); its Python 3.10 is the one the trainer supports on the Deep Learning VM too.
EXECUTOR_IMAGE = "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest"
PACKAGES_PREFIX = "vertex/packages/"
RUNS_PREFIX = "vertex/runs/"
#: The distribution's name, and the built-in config name the run's YAML takes inside it.
DIST_NAME = "forja_vertex_trainer"
CONFIG_NAME = "forja_vertex_run"
#: The run folder on the replica (its working directory); what matters goes to the bucket.
REPLICA_RUN_DIR = "forja-run"
#: The trainer's contract variable naming the run (its bucket prefix), as trainer_run sets it.
RUN_ENV = "FORJA_RUN"
POLL_S = 5.0
#: Seconds `cancel` waits for CANCELLING to become CANCELLED before it returns the state as it is.
CANCEL_WAIT_S = 60.0
#: Seconds (of the entries' own timestamps) each poll of the logs reads again, for lines Cloud
#: Logging ingests after newer ones; the lines already said are known by their insertId.
LOG_LOOKBACK_S = 60.0
#: The replicas' Python writes each line as it goes (a pipe would otherwise hold it in a buffer
#: until the process ends), so the logs can be followed while the job runs.
REPLICA_ENV = {"PYTHONUNBUFFERED": "1"}
#: The exit code in the error message of a job whose replica exited non-zero (Vertex's words).
_EXIT_STATUS = re.compile(r"exited with a non-zero status of (?P<code>\d+)")
_STATUS = {
    "JOB_STATE_SUCCEEDED": "completed", "JOB_STATE_FAILED": "failed", "JOB_STATE_CANCELLED": "cancelled",
    "JOB_STATE_EXPIRED": "failed", "JOB_STATE_PARTIALLY_SUCCEEDED": "failed",
}  # fmt: skip


@dataclass(frozen=True)
class VertexOptions:
    """Where and on what a Vertex run goes; None takes the default named beside it.

    machine_type: the project's VM (roles/gcp_instance's gcp_instance_machine_type, g2-standard-8);
    accelerator_type/count: what the catalog says that machine carries (NVIDIA_L4 x 1);
    bucket: --bucket, else the inventory's dataset_bucket or gcp_bucket_name (as `forja data push`).
    """

    bucket: str | None = None
    region: str = DEFAULT_REGION
    project: str | None = None
    machine_type: str | None = None
    accelerator_type: str | None = None
    accelerator_count: int | None = None
    replica_count: int = 1
    executor_image: str = EXECUTOR_IMAGE
    service_account: str | None = None
    #: Vertex's own limit on the job (scheduling.timeout), seconds; None: Vertex's default (7 days).
    job_timeout_s: int | None = None


@dataclass(frozen=True)
class Package:
    """The run's sdist in the bucket: where, by which hash, and whether this call uploaded it."""

    uri: str
    sha256: str
    uploaded: bool


# -- the Vertex client, loaded from its one home -------------------------------------------------
def vertex_module() -> ModuleType:
    """plugins/module_utils/forja_vertex.py, after the siblings it imports by name."""
    module_utils.load("forja_gcp_machines")
    module_utils.load("forja_gcp")
    return module_utils.load("forja_vertex", "forja._vertex_jobs")


def _jobs(project: str, region: str) -> Any:
    """A VertexJobs of the project and region over forja's one GCP client (its auth, FORJA_GCP_*)."""
    gcp, vertex = module_utils.load("forja_gcp"), vertex_module()
    config = gcp.GcpConfig(project=project, scopes=vertex.SCOPES, user_agent="forja-vertex/0.1")
    config.api_url = vertex.api_url(region, None, dict(config.env))
    return vertex.VertexJobs(gcp.GcpClient(config), project, region)


def _logs(project: str) -> Any:
    """A VertexLogs of the project over forja's one GCP client (FORJA_LOGGING_API_URL or Google's)."""
    gcp, vertex = module_utils.load("forja_gcp"), vertex_module()
    config = gcp.GcpConfig(project=project, scopes=vertex.SCOPES, user_agent="forja-vertex/0.1")
    return vertex.VertexLogs(gcp.GcpClient(config), project, vertex.logging_url(None, dict(config.env)))


def _project(options: VertexOptions, where: dict[str, Any]) -> str:
    project = options.project or os.environ.get("FORJA_GCP_PROJECT") or where.get("project")
    if not project:
        raise errors.ConfigError(
            "project",
            "Vertex AI needs the Google Cloud project: set FORJA_GCP_PROJECT "
            "(or the inventory's gcp_bucket_project)",
        )
    return str(project)


# -- the machine, from the project's VM and the one catalog ----------------------------------------
def default_machine() -> str:
    """roles/gcp_instance's machine type: the VM forja makes is the machine a Vertex run asks for."""
    from forja.runner import REPO_ROOT

    defaults = yaml.safe_load((REPO_ROOT / "roles/gcp_instance/defaults/main.yml").read_text()) or {}
    return str(defaults["gcp_instance_machine_type"])


def vertex_accelerator(compute_name: str) -> str:
    """Compute's ``nvidia-l4`` is Vertex's ``NVIDIA_L4`` (forja_vertex.to_compute_name the other way)."""
    return compute_name.upper().replace("-", "_")


def worker_pools(options: VertexOptions, package_uri: str, args: list[str], env: dict[str, str]) -> list:
    """The module's worker_pools for this run: the primary, then the other replicas in a second pool
    (Vertex's pool 0 has exactly one replica). Accelerators default to what the machine carries."""
    machine = options.machine_type or default_machine()
    accelerator, count = options.accelerator_type, options.accelerator_count
    if accelerator is None and count is None:
        catalog = module_utils.load("forja_gcp_machines")
        with contextlib.suppress(catalog.MachineSpecError):  # a bad machine: forja_vertex says so below
            gpus = catalog.resolve_gpus(machine, None, None)
            if gpus.gpu_type and gpus.gpu_count:
                accelerator, count = vertex_accelerator(gpus.gpu_type), gpus.gpu_count
    pool: dict[str, Any] = {
        "machine_type": machine,
        "accelerator_type": accelerator,
        "accelerator_count": count,
        "python_package": {
            "executor_image_uri": options.executor_image,
            "package_uris": [package_uri],
            "python_module": "trainer",
            "args": args,
        },
        "env": env,
    }
    if options.replica_count < 1:
        raise errors.ConfigError("replica_count", f"{options.replica_count} is not >= 1 (1: one machine)")
    rest = options.replica_count - 1
    return [{**pool, "replica_count": 1}, *([{**pool, "replica_count": rest}] if rest else [])]


def job_body(run_id: str, options: VertexOptions, package: str, runs_url: str) -> dict[str, Any]:
    """The CustomJob body, checked by forja_vertex (catalog, pools) before anything is sent. The
    trainer mirrors to ``runs_url/<run>/``, which is also the job's baseOutputDirectory."""
    vertex = vertex_module()
    args = ["train", "--config", CONFIG_NAME, "--out", REPLICA_RUN_DIR,
            "--set", f"checkpoint_bucket={runs_url}"]  # fmt: skip
    params = {
        "display_name": run_id,
        "worker_pools": worker_pools(options, package, args, {RUN_ENV: run_id, **REPLICA_ENV}),
        "base_output_dir": f"{runs_url}/{run_id}/",
        "service_account": options.service_account,
        "timeout": options.job_timeout_s,
        "labels": {"forja-run": run_id.lower()[:63]},
    }
    try:
        return dict(vertex.custom_job(params))
    except vertex.VertexSpecError as exc:
        field, _, why = str(exc).partition(": ")
        option = field.rsplit(".", 1)[-1].split("[", 1)[0]
        raise errors.ConfigError(
            option, f"{why} (forja train --backend vertex --machine-type/--accelerator/--accelerator-count)"
        ) from None


# -- the package ---------------------------------------------------------------------------------
def _trainer_dir() -> Path:
    import trainer

    return Path(trainer.__file__).parent


def _package_files(config: Path) -> dict[str, bytes]:
    """What the sdist holds, by path: the trainer package, the config as a built-in, pyproject.toml."""
    root = _trainer_dir()
    files = {
        f"trainer/{p.relative_to(root).as_posix()}": p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }
    files[f"trainer/configs/{CONFIG_NAME}.yaml"] = config.read_bytes()
    requirements = (root / "requirements.txt").read_text().splitlines()
    # The executor image has PyTorch: only the trainer's own list is installed beside it.
    deps = [r.strip() for r in requirements if r.strip() and not r.lstrip().startswith("#")]
    files["pyproject.toml"] = "\n".join([
        "[build-system]", 'requires = ["setuptools>=77"]', 'build-backend = "setuptools.build_meta"', "",
        "[project]", f'name = "{DIST_NAME}"', 'version = "0.0.0"', 'requires-python = ">=3.10"',
        f"dependencies = {json.dumps(deps)}", "",
        "[tool.setuptools.packages.find]", 'include = ["trainer", "trainer.*"]', "",
        "[tool.setuptools.package-data]",
        '"trainer" = ["data/*", "*.yaml", "configs/*.yaml", "requirements.txt"]', "",
    ]).encode()  # fmt: skip
    return files


def content_hash(files: dict[str, bytes]) -> str:
    """SHA-256 over every path and its bytes: the same inputs, the same package name (sdist bytes
    carry build times, so the inputs are hashed, not the archive)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return digest.hexdigest()


def build_sdist(files: dict[str, bytes], out_dir: Path) -> Path:
    """The sdist of ``files``, built by setuptools' build_meta in a child process (it works in the
    current folder, which a library must not change under its caller's threads)."""
    with tempfile.TemporaryDirectory(prefix="forja-vertex-src-") as src:
        for rel, data in files.items():
            path = Path(src, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        code = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
        done = subprocess.run([sys.executable, "-c", code, str(out_dir)], cwd=src, capture_output=True,
                              text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise errors.ForjaError(f"building the run's package failed (setuptools): {done.stderr[-800:]}")
    return out_dir / done.stdout.strip().splitlines()[-1]


def package_uri(bucket: str, sha: str) -> str:
    return f"gs://{bucket}/{PACKAGES_PREFIX}{sha[:32]}/{DIST_NAME}-0.0.0.tar.gz"


def upload_package(client: Any, bucket: str, files: dict[str, bytes], sha: str) -> Package:
    """Build and upload the run's sdist unless the bucket has it under the same content hash."""
    uri = package_uri(bucket, sha)
    blob = client.bucket(bucket).blob(uri.removeprefix(f"gs://{bucket}/"))
    if blob.exists():
        return Package(uri, sha, uploaded=False)
    with tempfile.TemporaryDirectory(prefix="forja-vertex-dist-") as out:
        sdist = build_sdist(files, Path(out))
        blob.metadata = {"forja-content-sha256": sha}
        with contextlib.suppress(_precondition_failed()):  # another call uploaded it meanwhile
            blob.upload_from_filename(str(sdist), content_type="application/gzip", if_generation_match=0)
    return Package(uri, sha, uploaded=True)


def _precondition_failed() -> type[Exception]:
    from google.api_core import exceptions as api_exceptions

    return api_exceptions.PreconditionFailed


# -- submit, follow, cancel ----------------------------------------------------------------------
@dataclass(frozen=True)
class Submitted:
    """A job Vertex accepted: its resource name, the run's bucket prefix, the package sent."""

    run_id: str
    job_name: str
    state: str
    run_prefix: str
    package: Package
    bucket: str


def submit(forja: Any, config: Path, run_id: str, options: VertexOptions) -> Submitted:
    """Check everything, upload the package if it is new, create the job. Nothing is built,
    uploaded or created when the bucket, the project or the machine is wrong."""
    from forja import datasets

    where = datasets.settings(forja, options.bucket)
    if not where["bucket"]:
        raise errors.ConfigError(
            "bucket",
            "a Vertex run reads its package from a bucket and writes its "
            "results there: give --bucket gs://BUCKET (or the inventory's "
            "gcp_bucket_name / dataset_bucket)",
        )
    push = datasets.dataset_module()
    try:
        bucket = push.bucket_from_url(where["bucket"])
    except push.DatasetError as exc:
        raise errors.ConfigError("bucket", exc.message.split(": ", 1)[1]) from None
    project = _project(options, where)
    files = _package_files(config)
    sha = content_hash(files)
    run_prefix = f"gs://{bucket}/{RUNS_PREFIX}{run_id}/"
    body = job_body(run_id, options, package_uri(bucket, sha), f"gs://{bucket}/{RUNS_PREFIX.rstrip('/')}")
    client = push.make_client(where["project"] or project, where["emulator"], where["credentials_file"])
    with storage_errors(bucket):
        package = upload_package(client, bucket, files, sha)
    with vertex_errors():
        job = _jobs(project, options.region).create(body)
    return Submitted(run_id, job["name"], job.get("state", ""), run_prefix, package, bucket)


@contextlib.contextmanager
def storage_errors(bucket: str) -> Iterator[None]:
    """Cloud Storage's answers about the bucket as forja's errors, naming the fix."""
    from google.api_core import exceptions as api_exceptions

    try:
        yield
    except api_exceptions.NotFound:
        raise errors.ConfigError(
            "bucket",
            f"gs://{bucket} does not exist; create it (forja up -e gcp_bucket_name={bucket}) or give another",
        ) from None
    except api_exceptions.GoogleAPICallError as exc:
        raise errors.ForjaError(f"gs://{bucket}: {exc}") from None


@contextlib.contextmanager
def vertex_errors() -> Iterator[None]:
    """The Vertex client's errors (an HTTP 400 with Google's message, no network) as forja's."""
    try:
        yield
    except gcp_errors("GcpApiError") as exc:
        if exc.status == 400:
            raise errors.ConfigError("vertex", f"Vertex AI refused the job: {exc}") from None
        raise errors.ForjaError(f"Vertex AI: {exc}") from None
    except gcp_errors("GcpError") as exc:
        raise errors.ForjaError(f"Vertex AI: {exc}") from None


def gcp_errors(name: str) -> tuple[type[Exception], ...]:
    """forja_gcp's error class ``name`` as forja loads it by path and as forja_vertex imported it
    (the installed collection's copy, when Ansible's collection loader is active): either is raised."""
    return tuple({getattr(module_utils.load("forja_gcp"), name), getattr(vertex_module(), name)})


def find(run_id: str, options: VertexOptions) -> dict[str, Any]:
    """The newest job of this run (display name = run id) in the project and region."""
    with vertex_errors():
        jobs = _jobs(_project(options, {}), options.region)
        found = jobs.find(run_id)
    if not found:
        raise errors.RunNotFound(
            f"no Vertex AI job of run {run_id!r} in {jobs.parent}; check the region "
            "(--region) and the project (FORJA_GCP_PROJECT)"
        )
    return dict(found[-1])


def format_timestamp(stamp: datetime) -> str:
    return stamp.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LogTail:
    """The lines of one job not said yet, poll after poll (see the module docstring: why no clock)."""

    logs: Any
    job_id: str
    #: The job's createTime (Vertex's clock): nothing of the job is older.
    since: str
    lookback_s: float = LOG_LOOKBACK_S
    #: insertId -> timestamp of the lines said within the look-back window.
    said: dict[str, datetime] = field(default_factory=dict)

    def poll(self) -> list[dict[str, Any]]:
        newest = max(self.said.values(), default=None)
        bound = (
            self.since if newest is None else format_timestamp(newest - timedelta(seconds=self.lookback_s))
        )
        fresh = [e for e in self.logs.entries(self.job_id, bound) if e.get("insertId") not in self.said]
        for entry in fresh:
            self.said[entry.get("insertId", "")] = parse_time(entry["timestamp"])
        if fresh:
            oldest_kept = max(self.said.values()) - timedelta(seconds=self.lookback_s)
            self.said = {k: t for k, t in self.said.items() if t >= oldest_kept}
        return fresh


def _say_lines(tail: LogTail | None, emit: Callable[[ev.Event], None]) -> LogTail | None:
    """Each new line as an announcement by its replica; None (logs no longer read) once they fail."""
    if tail is None:
        return None
    try:
        entries = tail.poll()
    except gcp_errors("GcpError") as exc:
        emit(
            ev.Announcement(
                0, host="vertex", text=f"the job's logs cannot be read ({exc}); following its state"
            )
        )
        return None
    for entry in entries:
        replica = entry.get("resource", {}).get("labels", {}).get("task_name", "replica")
        text = entry.get("textPayload")
        if text is None:
            text = json.dumps(entry.get("jsonPayload", {}))
        emit(ev.Announcement(0, host=replica, text=text))
    return tail


def watch(
    job_name: str,
    options: VertexOptions,
    project: str,
    *,
    emit: Callable[[ev.Event], None],
    poll_s: float = POLL_S,
    timeout_s: float | None = None,
    cancel: threading.Event | None = None,
) -> tuple[dict[str, Any], str | None]:
    """Poll the job, announcing each new state and its replicas' new log lines, until it ends:
    (job, None); or until `timeout_s`, `cancel` or Ctrl-C stop the watching while the job goes on:
    (job, "timeout" | "interrupted")."""
    vertex = vertex_module()
    token = cancel or threading.Event()
    deadline = None if not timeout_s else time.monotonic() + timeout_s
    seen = ""
    try:
        with vertex_errors():
            jobs = _jobs(project, options.region)
            job_id = job_name.rsplit("/", 1)[-1]
            job = jobs.get(job_name)
            tail: LogTail | None = LogTail(_logs(project), job_id, job.get("createTime", ""))
            while True:
                state = job.get("state", "")
                tail = _say_lines(tail, emit)  # read after the state: a final state's lines are all in
                if state != seen:
                    emit(ev.Announcement(0, host="vertex", text=f"job {job_id}: {state}"))
                    seen = state
                if state in vertex.FINAL_STATES:
                    return job, None
                if deadline is not None and time.monotonic() >= deadline:
                    return job, "timeout"
                wait = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
                if token.wait(wait):
                    return job, "interrupted"
                job = jobs.get(job_name)
    except KeyboardInterrupt:
        return {"name": job_name, "state": seen}, "interrupted"


def status_of(job: dict[str, Any]) -> str:
    """forja's history status of a Vertex state ("running" while it goes on)."""
    return _STATUS.get(job.get("state", ""), "running")


def fetch_results(forja: Any, bucket: str, run_id: str, dest: Path, checkpoints: bool = False) -> dict:
    """The run's logs and model from gs://BUCKET/vertex/runs/<run>/ into `dest` (checkpoints only if
    asked); the summary: the trainer's own summary.json, which its mirror uploads beside the logs
    (``logs/summary.json``, trainer.mirror.SUMMARY_FILE), else (a trainer that did not upload it)
    the headline figures of the last metrics line."""
    from forja import datasets
    from trainer.mirror import SUMMARY_FILE
    from trainer.summary import Summary

    where = datasets.settings(forja, f"gs://{bucket}")
    mod = datasets.dataset_module()
    client = mod.make_client(where["project"], where["emulator"], where["credentials_file"])
    prefix = f"{RUNS_PREFIX}{run_id}/"
    with storage_errors(bucket):
        blobs = list(client.list_blobs(bucket, prefix=prefix))
    for blob in blobs:
        rel = blob.name[len(prefix) :]
        skipped = not checkpoints and rel.startswith("checkpoints/")
        if not rel or rel.endswith("/") or ".partial/" in rel or skipped:
            continue
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(path))
    uploaded = dest / "logs" / SUMMARY_FILE
    if uploaded.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "summary.json").write_bytes(uploaded.read_bytes())
        return dict(json.loads(uploaded.read_text()))
    rows = [json.loads(line) for line in _lines(dest / "logs" / "metrics.jsonl")]
    last = rows[-1] if rows else {}
    summary = Summary.from_dict({
        "status": "completed", "steps": last.get("step"), "final_loss": last.get("loss"),
        "wall_s": last.get("wall_s"), "cost_usd": last.get("cost_usd"),
    }).to_dict()  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def run_summary(forja: Any, bucket: str, run_id: str) -> dict[str, Any]:
    """The trainer's summary.json of a run as its mirror uploaded it (logs/summary.json under the run's
    prefix); {} when there is none or it cannot be read: only a failed job asks, and its failure
    stands without it."""
    from forja import datasets
    from trainer.mirror import SUMMARY_FILE

    try:
        where = datasets.settings(forja, f"gs://{bucket}")
        client = datasets.dataset_module().make_client(
            where["project"], where["emulator"], where["credentials_file"])
        found = json.loads(client.bucket(bucket).blob(f"{RUNS_PREFIX}{run_id}/logs/{SUMMARY_FILE}")
                           .download_as_bytes())
    except Exception:  # not there (the replica died first), no access, not JSON: nothing to add
        return {}
    return dict(found) if isinstance(found, dict) else {}


def failed_status(job: dict[str, Any], summary: dict[str, Any]) -> str:
    """What a failed job's run is: "diverged" when its trainer stopped it so, else "failed".

    Vertex says only JOB_STATE_FAILED. The trainer says why: its summary.json (status "diverged"),
    and its exit code 7 (trainer.exit_codes.DIVERGED), which Vertex puts in the job's error message
    ("The replica workerpool0-0 exited with a non-zero status of 7.", a google.rpc.Status with no
    field of its own for it); the message counts when the summary did not reach the bucket.
    """
    from trainer.exit_codes import DIVERGED

    if summary.get("status") == "diverged":
        return "diverged"
    exited = _EXIT_STATUS.search((job.get("error") or {}).get("message") or "")
    return "diverged" if exited and int(exited["code"]) == DIVERGED else "failed"


def diverged_message(summary: dict[str, Any]) -> str:
    """What a diverged job's run says: the trainer's own sentence (trainer.divergence.sentence, as a
    VM run's summary says it) from the summary's record, or only that it diverged without one."""
    from trainer.divergence import sentence

    record = summary.get("divergence")
    return sentence(record) if isinstance(record, dict) and "step" in record and "reason" in record else (
        "diverged (its trainer exited 7; no summary reached the bucket): not restarted, nothing exported")


def _lines(path: Path) -> Iterator[str]:
    if path.is_file():
        yield from (line for line in path.read_text().splitlines() if line.strip())


def finish(
    forja: Any, run_id: str, job: dict[str, Any], detached: str | None, *, fetch: bool, checkpoints: bool
) -> TrainResult:
    """Record how the watching ended in the history; fetch a completed run; the TrainResult."""
    from forja.api import TrainResult, _now
    from forja.history import summary_fields

    hosts = [job.get("name", "")]
    if detached is not None:
        with contextlib.suppress(errors.RunNotFound):
            forja.history.record_event(run_id, "detached", reason=detached)
        return TrainResult(run_id, "running", hosts, {}, None, detached=detached)
    status = status_of(job)
    summary: dict[str, Any] = {}
    artifact: Path | None = None
    output = job.get("jobSpec", {}).get("baseOutputDirectory", {}).get("outputUriPrefix", "")
    bucket = output.removeprefix("gs://").split("/")[0] if output.startswith("gs://") else None
    if status == "completed" and fetch and bucket:
        artifact = forja.results_dir(run_id) / "vertex"
        summary = fetch_results(forja, bucket, run_id, artifact, checkpoints)
    message = (job.get("error") or {}).get("message")
    if job.get("state") == "JOB_STATE_FAILED":
        summary = run_summary(forja, bucket, run_id) if bucket else {}
        status = failed_status(job, summary)
        if status == "diverged":
            message = f"Vertex AI job {job['name']} of run {run_id} {diverged_message(summary)}"
    forja.history.update(
        run_id,
        status=status,
        hosts=hosts,
        ended_at=_now(),
        **summary_fields(summary),
        **({"message": message} if message else {}),
    )
    if status == "cancelled":
        raise errors.Cancelled(f"Vertex AI job {job['name']} of run {run_id} was cancelled")
    if status == "diverged":
        raise errors.RunDiverged.of_job(job["name"], message)
    if status != "completed":
        raise errors.ForjaError(
            f"Vertex AI job {job['name']} of run {run_id} ended {job.get('state')}: {message or 'no message'}"
        )
    return TrainResult(run_id, status, hosts, summary, artifact)


def how_to_follow(run_id: str) -> str:
    """What to tell a person whose command stopped watching a Vertex run that goes on."""
    return f"follow it with `forja vertex follow {run_id}`; cancel it with `forja vertex cancel {run_id}`"


def train(
    forja: Any,
    config: str | Path | None,
    *,
    name: str | None,
    options: VertexOptions | None,
    unsupported: dict[str, Any],
    wait: bool,
    fetch: bool,
    checkpoints: bool,
    timeout_s: float | None,
    poll_s: float | None,
    emit: Callable[[ev.Event], None],
    cancel: threading.Event | None,
) -> TrainResult:
    """`Forja.train(backend="vertex")`'s work: check, submit (recorded in the history), then watch.
    `unsupported` holds train's options a Vertex run does not take yet; any one given is refused."""
    from forja.api import RUN_NAME, TrainResult, _config_hash, _new_run_id, _now

    for option, value in unsupported.items():
        if value:
            raise errors.ConfigError(
                option,
                "not taken by --backend vertex yet (the built-in trainer on a "
                "config runs there); drop it, or train on the VM (--backend vm)",
            )
    path = Path(config).expanduser().resolve() if config is not None else None
    if path is None or not path.is_file():
        raise errors.ConfigError("config", f"{config} is not a file; give a trainer config YAML")
    judged = trainer_config.judge(path)
    run_id = name or _new_run_id(path)
    if not RUN_NAME.match(run_id):
        raise errors.ConfigError("name", f"{run_id!r} must be 1-63 letters, digits, '-' or '_'")
    options = options or VertexOptions()
    forja.history.start(run_id, name=run_id, config_path=str(path), config_hash=_config_hash(path))
    try:
        sent = submit(forja, path, run_id, options)
    except BaseException as exc:
        forja.history.update(run_id, status="failed", ended_at=_now(), message=f"not submitted: {exc}")
        raise
    forja.history.update(run_id, hosts=[sent.job_name])
    said = "uploaded" if sent.package.uploaded else "already in the bucket"
    emit(ev.Announcement(0, host="vertex", text=f"package {sent.package.uri} ({said})"))
    emit(ev.Announcement(0, host="vertex", text=f"job {sent.job_name}; results go to {sent.run_prefix}"))
    if not wait:
        forja.history.record_event(run_id, "detached", reason="detach")
        return TrainResult(run_id, "running", [sent.job_name], {}, None, detached="detach",
                           unchecked=judged.unchecked)
    job, detached = watch(sent.job_name, options, sent.job_name.split("/")[1], emit=emit,
                          poll_s=poll_s or POLL_S, timeout_s=timeout_s, cancel=cancel)  # fmt: skip
    ended = finish(forja, run_id, job, detached, fetch=fetch, checkpoints=checkpoints)
    return dataclasses.replace(ended, unchecked=judged.unchecked)


def follow_run(
    forja: Any,
    run_id: str,
    options: VertexOptions,
    *,
    fetch: bool,
    timeout_s: float | None,
    poll_s: float | None,
    emit: Callable[[ev.Event], None],
    cancel: threading.Event | None,
) -> TrainResult:
    """`Forja.vertex_follow`: pick a Vertex run up again by its name, watch it, fetch its results."""
    job = find(run_id, options)
    project = job["name"].split("/")[1]
    job, detached = watch(
        job["name"], options, project, emit=emit, poll_s=poll_s or POLL_S, timeout_s=timeout_s, cancel=cancel
    )
    return finish(forja, run_id, job, detached, fetch=fetch, checkpoints=False)


def cancel_run(forja: Any, run_id: str, options: VertexOptions, wait_s: float = CANCEL_WAIT_S) -> dict:
    """Cancel the run's job if it still goes on; wait (a bounded while) for Vertex to say CANCELLED."""
    from forja.api import _now

    vertex = vertex_module()
    job = find(run_id, options)
    if job.get("state") not in vertex.FINAL_STATES:
        with vertex_errors():
            jobs = _jobs(job["name"].split("/")[1], options.region)
            if job.get("state") != "JOB_STATE_CANCELLING":
                jobs.cancel(job["name"])
            job = dict(jobs.wait(job["name"], wait_s, 0.2))
    with contextlib.suppress(errors.RunNotFound):
        forja.history.update(
            run_id, status=status_of(job) if status_of(job) != "running" else "cancelled", ended_at=_now()
        )
    return job
