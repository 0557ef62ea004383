"""What a Vertex AI run is made of, before it is sent: its options, the trainer packaged as an sdist,
the machine and the CustomJob body, and the Vertex client they go through.

Why apart from `forja.vertex`: that module sends, follows and cancels a run over a session; this
one builds what is sent from the options and the repository alone (no session, no history), so the
package and the job body can be read and tested without a project.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from forja import errors, module_utils

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
#: The replicas' Python writes each line as it goes (a pipe would otherwise hold it in a buffer
#: until the process ends), so the logs can be followed while the job runs.
REPLICA_ENV = {"PYTHONUNBUFFERED": "1"}


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


def jobs_client(project: str, region: str) -> Any:
    """A VertexJobs of the project and region over forja's one GCP client (its auth, FORJA_GCP_*)."""
    gcp, vertex = module_utils.load("forja_gcp"), vertex_module()
    config = gcp.GcpConfig(project=project, scopes=vertex.SCOPES, user_agent="forja-vertex/0.1")
    config.api_url = vertex.api_url(region, None, dict(config.env))
    return vertex.VertexJobs(gcp.GcpClient(config), project, region)


def logs_client(project: str) -> Any:
    """A VertexLogs of the project over forja's one GCP client (FORJA_LOGGING_API_URL or Google's)."""
    gcp, vertex = module_utils.load("forja_gcp"), vertex_module()
    config = gcp.GcpConfig(project=project, scopes=vertex.SCOPES, user_agent="forja-vertex/0.1")
    return vertex.VertexLogs(gcp.GcpClient(config), project, vertex.logging_url(None, dict(config.env)))


def project_of(options: VertexOptions, where: dict[str, Any]) -> str:
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
    from forja.paths import REPO_ROOT

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
def trainer_dir() -> Path:
    import trainer

    return Path(trainer.__file__).parent


def package_files(config: Path) -> dict[str, bytes]:
    """What the sdist holds, by path: the trainer package, the config as a built-in, pyproject.toml."""
    root = trainer_dir()
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
        with contextlib.suppress(precondition_failed()):  # another call uploaded it meanwhile
            blob.upload_from_filename(str(sdist), content_type="application/gzip", if_generation_match=0)
    return Package(uri, sha, uploaded=True)


def precondition_failed() -> type[Exception]:
    from google.api_core import exceptions as api_exceptions

    return api_exceptions.PreconditionFailed
