"""`forja train CONFIG --backend vertex`: one training run as a Vertex AI custom job.

Why it is built this way:

* What runs is a Python source distribution, the form Vertex's ``pythonPackageSpec`` pip-installs:
  the trainer package with the run's config inside it (as the trainer's built-in config
  ``forja_vertex_run``), built by setuptools' own ``build_meta`` (no hand-made tarball), stored
  under the hash of what goes in (``gs://BUCKET/vertex/packages/<hash>/...``), so a second run of
  the same trainer and config builds and uploads nothing.
* The user's own script goes the same way (``forja train --script --project --backend vertex``):
  the sdist holds the trainer, the project as forja_bundle packs it for a VM (the same exclusions
  and key checks) and the project's requirements as its dependencies, and each replica runs
  ``trainer.vertex_launch``, which does on Vertex what the VM's forja-train-launch does (torchrun,
  one process per GPU, the run contract), so ``trainer.runlib`` mirrors checkpoints and logs to
  the same ``gs://BUCKET/vertex/runs/<run>/`` and resumes from there when Vertex restarts the job.
  ``--image`` sends no package: the user's container runs with the contract in its environment.
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
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forja import cost_report, defaults, errors, module_utils, trainer_config, vertex_job
from forja import events as ev
from forja.runs import RUN_NAME, TrainResult, config_hash, new_run_id, now
from forja.vertex_job import (
    RUNS_PREFIX,
    OwnCode,
    Package,
    VertexOptions,
    check_requirements_resolve,
    content_hash,
    job_body,
    jobs_client,
    logs_client,
    package_files,
    package_uri,
    project_of,
    project_package_files,
    upload_package,
    vertex_module,
)

if TYPE_CHECKING:
    from forja.session import Session

#: Seconds between two looks at a job's state and its new log lines.
POLL_S = defaults.VERTEX_POLL_S
#: Seconds `cancel` waits for CANCELLING to become CANCELLED before it returns the state as it is.
CANCEL_WAIT_S = 60.0
#: Seconds (of the entries' own timestamps) each poll of the logs reads again, for lines Cloud
#: Logging ingests after newer ones; the lines already said are known by their insertId.
LOG_LOOKBACK_S = 60.0
#: The exit code in the error message of a job whose replica exited non-zero (Vertex's words).
_EXIT_STATUS = re.compile(r"exited with a non-zero status of (?P<code>\d+)")
_STATUS = {
    "JOB_STATE_SUCCEEDED": "completed", "JOB_STATE_FAILED": "failed", "JOB_STATE_CANCELLED": "cancelled",
    "JOB_STATE_EXPIRED": "failed", "JOB_STATE_PARTIALLY_SUCCEEDED": "failed",
}  # fmt: skip


# -- submit, follow, cancel ----------------------------------------------------------------------
@dataclass(frozen=True)
class Submitted:
    """A job Vertex accepted: its resource name, the run's bucket prefix, the package sent."""

    run_id: str
    job_name: str
    state: str
    run_prefix: str
    #: None for a user's image (nothing is uploaded).
    package: Package | None
    bucket: str


def submit(
    forja: Session, config: Path | None, run_id: str, options: VertexOptions, code: OwnCode | None = None
) -> Submitted:
    """Check everything, upload the package if it is new, create the job. Nothing is built,
    uploaded or created when the bucket, the project, the script, its requirements, the image or
    the machine is wrong. `code`: the user's own script (or image) instead of the built-in trainer
    on `config`."""
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
    project = project_of(options, where)
    files: dict[str, bytes] = {}
    deps: list[str] = []
    if code is None:
        assert config is not None
        files = package_files(config)
    elif not options.image:
        files, deps = project_package_files(code)
    sha = content_hash(files)
    run_prefix = f"gs://{bucket}/{RUNS_PREFIX}{run_id}/"
    runs_url = f"gs://{bucket}/{RUNS_PREFIX.rstrip('/')}"
    body = job_body(run_id, options, package_uri(bucket, sha), runs_url, code)
    client = push.make_client(where["project"] or project, where["emulator"], where["credentials_file"])
    package = None
    if files:
        with storage_errors(bucket):
            name = package_uri(bucket, sha).removeprefix(f"gs://{bucket}/")
            if deps and not client.bucket(bucket).blob(name).exists():
                check_requirements_resolve(deps)  # a new package: its requirements, before the upload
            package = upload_package(client, bucket, files, sha)
    with vertex_errors():
        job = jobs_client(project, options.region).create(body)
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
        if type(exc).__name__ == "GcpAuthError":  # no key or a bad one: the user's input, exit 2 as elsewhere
            field, _, fix = exc.message.partition(": ")
            raise errors.ConfigError(field if fix else "credentials", fix or exc.message) from None
        raise errors.ForjaError(f"Vertex AI: {exc}") from None


def gcp_errors(name: str) -> tuple[type[Exception], ...]:
    """forja_gcp's error class ``name`` as forja loads it by path and as forja_vertex imported it
    (the installed collection's copy, when Ansible's collection loader is active): either is raised."""
    return tuple({getattr(module_utils.load("forja_gcp"), name), getattr(vertex_module(), name)})


def find(run_id: str, options: VertexOptions) -> dict[str, Any]:
    """The newest job of this run (display name = run id) in the project and region."""
    with vertex_errors():
        jobs = jobs_client(project_of(options, {}), options.region)
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
        # RFC 3339, any fraction (Logging writes nine digits); the cost package loads the price rules
        from forja.cost.spend import parse_time

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
            jobs = jobs_client(project, options.region)
            job_id = job_name.rsplit("/", 1)[-1]
            job = jobs.get(job_name)
            tail: LogTail | None = LogTail(logs_client(project), job_id, job.get("createTime", ""))
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


def fetch_results(forja: Session, bucket: str, run_id: str, dest: Path, checkpoints: bool = False) -> dict:
    """The run's logs and model from gs://BUCKET/vertex/runs/<run>/ into `dest` (checkpoints only if
    asked; metrics.jsonl and events.jsonl also at the top, as a VM run's fetched folder has them);
    the summary: the trainer's own summary.json, which its mirror uploads beside the logs
    (``logs/summary.json``, trainer.run_folder.SUMMARY), else (a trainer that did not upload it)
    the headline figures of the last metrics line."""
    from forja import datasets
    from trainer.run_folder import CHECKPOINTS_DIR, EVENTS, LOGS_DIR, METRICS, SUMMARY
    from trainer.summary import Summary

    where = datasets.settings(forja, f"gs://{bucket}")
    mod = datasets.dataset_module()
    client = mod.make_client(where["project"], where["emulator"], where["credentials_file"])
    prefix = f"{RUNS_PREFIX}{run_id}/"
    with storage_errors(bucket):
        blobs = list(client.list_blobs(bucket, prefix=prefix))
    for blob in blobs:
        rel = blob.name[len(prefix) :]
        skipped = not checkpoints and rel.startswith(f"{CHECKPOINTS_DIR}/")
        if not rel or rel.endswith("/") or ".partial/" in rel or skipped:
            continue
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(path))
    for name in (METRICS, EVENTS):  # where a VM run's fetched folder has them: forja cost --run reads them
        if (dest / LOGS_DIR / name).is_file():
            (dest / name).write_bytes((dest / LOGS_DIR / name).read_bytes())
    uploaded = dest / LOGS_DIR / SUMMARY
    if uploaded.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        (dest / SUMMARY).write_bytes(uploaded.read_bytes())
        return dict(json.loads(uploaded.read_text()))
    rows = [json.loads(line) for line in _lines(dest / LOGS_DIR / METRICS)]
    last = rows[-1] if rows else {}
    summary = Summary.from_dict({
        "status": "completed", "steps": last.get("step"), "final_loss": last.get("loss"),
        "wall_s": last.get("wall_s"), "cost_usd": last.get("cost_usd"),
    }).to_dict()  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    (dest / SUMMARY).write_text(json.dumps(summary, indent=2))
    return summary


def note_rate(job: dict[str, Any], dest: Path) -> None:
    """The job's machines' hourly rate, as ``price_per_hour`` in the fetched folder's config.yaml (where
    `forja cost --run` reads a run's rate when no VM is named): every replica's machine at Compute
    Engine's on-demand price in the job's region (forja's price table), a floor of what Vertex AI
    bills (its custom training price adds a management fee per machine). A config.yaml the run
    itself wrote is left alone; a machine the table does not price writes nothing."""
    from forja.cost.prices import PriceError, load_prices
    from forja.cost.spend import rate_of
    from trainer.run_folder import CONFIG

    if (dest / CONFIG).exists():
        return
    region = job.get("name", "").split("/")[3] if job.get("name", "").count("/") >= 3 else ""
    try:
        prices = load_prices(None)
        usd = sum(rate_of(pool["machineSpec"]["machineType"], region, prices).usd_per_hour
                  * int(pool.get("replicaCount") or 1)
                  for pool in job.get("jobSpec", {}).get("workerPoolSpecs", []))  # fmt: skip
    except (PriceError, ValueError, KeyError):
        return
    if usd > 0:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / CONFIG).write_text("# The Vertex AI job's machines at Compute Engine's on-demand rate "
                                   "(forja's price table), for forja cost --run\n"
                                   f"price_per_hour: {usd:.6f}\n")


def run_summary(forja: Session, bucket: str, run_id: str) -> dict[str, Any]:
    """The trainer's summary.json of a run as its mirror uploaded it (logs/summary.json under the run's
    prefix); {} when there is none or it cannot be read: only a failed job asks, and its failure
    stands without it."""
    from forja import datasets
    from trainer.run_folder import LOGS_DIR, SUMMARY

    try:
        where = datasets.settings(forja, f"gs://{bucket}")
        client = datasets.dataset_module().make_client(
            where["project"], where["emulator"], where["credentials_file"])
        found = json.loads(client.bucket(bucket).blob(f"{RUNS_PREFIX}{run_id}/{LOGS_DIR}/{SUMMARY}")
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
    forja: Session, run_id: str, job: dict[str, Any], detached: str | None, *, fetch: bool, checkpoints: bool
) -> TrainResult:
    """Record how the watching ended in the history; fetch a completed run; the TrainResult."""
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
        note_rate(job, artifact)
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
        ended_at=now(),
        **({"artifact_dir": str(artifact)} if artifact is not None else {}),
        **summary_fields(summary),
        **({"message": message} if message else {}),
    )
    cost_report.settle(forja, run_id, [])  # the job's machines at their rate (note_rate), no VM's disk
    if status == "cancelled":
        raise errors.Cancelled(f"Vertex AI job {job['name']} of run {run_id} was cancelled")
    if status == "diverged":
        raise errors.RunDiverged.of_job(job["name"], message)
    if status != "completed":
        raise errors.ForjaError(
            f"Vertex AI job {job['name']} of run {run_id} ended {job.get('state')}: {message or 'no message'}"
        )
    return TrainResult.ended(forja.history.get(run_id), cost_report.settled_cost(forja.history, run_id),
                             summary, artifact)


def how_to_follow(run_id: str) -> str:
    """What to tell a person whose command stopped watching a Vertex run that goes on."""
    return f"follow it with `forja vertex follow {run_id}`; cancel it with `forja vertex cancel {run_id}`"


def train(
    forja: Session,
    config: str | Path | None,
    *,
    name: str | None,
    options: VertexOptions | None,
    unsupported: dict[str, Any],
    own: dict[str, Any] | None = None,
    wait: bool,
    fetch: bool,
    checkpoints: bool,
    timeout_s: float | None,
    poll_s: float | None,
    emit: Callable[[ev.Event], None],
    cancel: threading.Event | None,
) -> TrainResult:
    """`Forja.train(backend="vertex")`'s work: check, submit (recorded in the history), then watch.
    What runs: the built-in trainer on `config`, the user's own script (`own["script"]` in
    `own["project"]`, with `own["args"]`, `own["excludes"]`, `own["procs"]`, checked by `own["plan"]`,
    forja.training.plan_run), or the user's image
    (`options.image`, with `own["args"]`). `unsupported` holds train's options a Vertex run does not
    take; any one given is refused."""
    for option, value in unsupported.items():
        if value:
            raise errors.ConfigError(
                option, "not taken by --backend vertex; drop it, or train on the VM (--backend vm)"
            )
    options = options or VertexOptions()
    code, record = own_code(forja, config, options, own or {})
    judged = trainer_config.judge(record) if code is None else None
    run_id = name or new_run_id(record if record is not None else Path(options.image or "image"))
    if not RUN_NAME.match(run_id):
        raise errors.ConfigError("name", f"{run_id!r} must be 1-63 letters, digits, '-' or '_'")
    forja.history.start(run_id, name=run_id, config_path=str(record or options.image),
                        config_hash=config_hash(record) if record else None)  # fmt: skip
    try:
        sent = submit(forja, record if code is None else None, run_id, options, code)
    except BaseException as exc:
        forja.history.update(run_id, status="failed", ended_at=now(), message=f"not submitted: {exc}")
        raise
    forja.history.update(run_id, hosts=[sent.job_name])
    if sent.package is not None:
        said = "uploaded" if sent.package.uploaded else "already in the bucket"
        emit(ev.Announcement(0, host="vertex", text=f"package {sent.package.uri} ({said})"))
    else:
        emit(ev.Announcement(0, host="vertex", text=f"image {options.image}"))
    emit(ev.Announcement(0, host="vertex", text=f"job {sent.job_name}; results go to {sent.run_prefix}"))
    if not wait:
        forja.history.record_event(run_id, "detached", reason="detach")
        return TrainResult(run_id, "running", [sent.job_name], {}, None, detached="detach",
                           unchecked=judged.unchecked if judged else ())
    job, detached = watch(sent.job_name, options, sent.job_name.split("/")[1], emit=emit,
                          poll_s=poll_s or POLL_S, timeout_s=timeout_s, cancel=cancel)  # fmt: skip
    ended = finish(forja, run_id, job, detached, fetch=fetch, checkpoints=checkpoints)
    return dataclasses.replace(ended, unchecked=judged.unchecked if judged else ())


def own_code(
    forja: Session, config: str | Path | None, options: VertexOptions, own: dict[str, Any]
) -> tuple[OwnCode | None, Path | None]:
    """What a Vertex run runs, checked before anything is sent: (None, the config) for the built-in
    trainer, (OwnCode, the script) for the user's script in the project, (OwnCode, None) for the
    user's image. The script is checked as for a VM: by `own["plan"]`, forja.training.plan_run (a
    file inside the project), which forja.training hands down (this module is below it)."""
    script, args, project = own.get("script"), [str(a) for a in own.get("args") or ()], own.get("project")
    excludes, procs = tuple(own.get("excludes") or ()), own.get("procs")
    if options.image:
        for option, value in (("script", script), ("project", project), ("config", config)):
            if value:
                raise errors.ConfigError(
                    option, f"--image runs your image's own entrypoint ({options.image}): nothing of the "
                    "project is sent; give the entrypoint's arguments after --, or drop --image to send "
                    "your script with the project"
                )
        if excludes:
            raise errors.ConfigError("excludes", "--image sends no project; drop --exclude")
        code = OwnCode(args=tuple(args), procs=procs)
        vertex_job.procs_per_replica(options, code)  # a bad --procs: before anything
        return code, None
    if script is None:
        for option, value in (("args", args), ("procs", procs), ("excludes", excludes)):
            if value:
                raise errors.ConfigError(
                    option, "is for your own script on Vertex (--script with --project); the built-in "
                    "trainer on a config takes its settings from the config"
                )
        path = Path(config).expanduser().resolve() if config is not None else None
        if path is None or not path.is_file():
            raise errors.ConfigError("config", f"{config} is not a file; give a trainer config YAML, or "
                                     "your own script with --script (or an image with --image)")
        return None, path
    if config is not None:
        raise errors.ConfigError(
            "config", "a config is the built-in trainer's; on Vertex your script takes its settings as "
            "arguments after -- (forja train --script train.py --backend vertex -- --lr 3e-4)"
        )
    project_dir = forja.project_folder(project, None, script)  # the script's own project, as on a VM
    if script is not None and not project and not forja.project_named:
        script = Path(script).expanduser().resolve()
    plan = own["plan"](None, script, args, project_dir)
    relative, *_ = plan.extravars["trainer_run_command"]
    code = OwnCode(project_dir, relative, tuple(args), excludes, procs)
    vertex_job.procs_per_replica(options, code)
    return code, plan.name_source


def follow_run(
    forja: Session,
    name: str,
    options: VertexOptions | None = None,
    *,
    fetch: bool = True,
    timeout_s: float | None = None,
    poll_s: float | None = None,
    on_event: Callable[[ev.Event], None] | None = None,
    cancel: threading.Event | None = None,
) -> TrainResult:
    """Follow a run sent with `forja train --backend vertex` until its Vertex AI job ends, saying
    each replica's new log lines (from Cloud Logging) as they come, then fetch its logs, summary
    and model from the bucket. The job is found by the run's name in the project
    (FORJA_GCP_PROJECT) and region (--region). Ctrl-C or a timeout stop watching, never the job."""
    run_id, options, emit = name, options or VertexOptions(), forja.fan_out(on_event)
    job = find(run_id, options)
    project = job["name"].split("/")[1]
    job, detached = watch(
        job["name"], options, project, emit=emit, poll_s=poll_s or POLL_S, timeout_s=timeout_s, cancel=cancel
    )
    return finish(forja, run_id, job, detached, fetch=fetch, checkpoints=False)


def cancel_run(
    forja: Session, name: str, options: VertexOptions | None = None, wait_s: float = CANCEL_WAIT_S
) -> dict:
    """Cancel the Vertex AI job of a run sent with `forja train --backend vertex`, found by the
    run's name in the project (FORJA_GCP_PROJECT) and region (--region); returns the job once
    Vertex says CANCELLED (or after a minute, as it is then). A job that ended is left alone."""
    run_id, options = name, options or VertexOptions()
    vertex = vertex_module()
    job = find(run_id, options)
    if job.get("state") not in vertex.FINAL_STATES:
        with vertex_errors():
            jobs = jobs_client(job["name"].split("/")[1], options.region)
            if job.get("state") != "JOB_STATE_CANCELLING":
                jobs.cancel(job["name"])
            job = dict(jobs.wait(job["name"], wait_s, 0.2))
    with contextlib.suppress(errors.RunNotFound):
        forja.history.update(
            run_id, status=status_of(job) if status_of(job) != "running" else "cancelled", ended_at=now()
        )
    return job
