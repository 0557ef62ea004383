"""What a Vertex AI run is made of, before it is sent: its options, the trainer (with the run's
config, or with the user's project and its requirements) packaged as an sdist, the user's image
checked, the machine and the CustomJob body, and the Vertex client they go through.

Why apart from `forja.vertex`: that module sends, follows and cancels a run over a session; this
one builds what is sent from the options and the repository alone (no session, no history), so the
package and the job body can be read and tested without a project.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
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
#: The module each replica of a user's own script runs: trainer/vertex_launch.py (torchrun, the contract).
LAUNCH_MODULE = "trainer.vertex_launch"
#: The trainer's contract variable naming the bucket prefix runlib mirrors checkpoints and logs to.
BUCKET_ENV = "FORJA_CHECKPOINT_BUCKET"
#: The project's dependency list, installed with the package on Vertex's image (as on the VM).
REQUIREMENTS = "requirements.txt"
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
    #: A container image the user built (containerSpec.imageUri), in Artifact Registry or Container
    #: Registry; it runs instead of a package, with the run contract in its environment.
    image: str | None = None


@dataclass(frozen=True)
class OwnCode:
    """The user's own code on Vertex: a script in the project with its arguments (it goes up with
    the project as a package), or, with ``VertexOptions.image``, arguments for the image's
    entrypoint. ``procs``: processes per replica (None: one per GPU of the machine)."""

    project: Path | None = None
    script: str | None = None
    args: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    procs: int | None = None


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


def machine_of(options: VertexOptions) -> tuple[str, str | None, int | None]:
    """The machine type and its accelerators: what the catalog says the machine carries unless given
    (a count alone takes the machine's accelerator type, so a count it cannot take is refused as such)."""
    machine = options.machine_type or default_machine()
    accelerator, count = options.accelerator_type, options.accelerator_count
    if accelerator is None:
        catalog = module_utils.load("forja_gcp_machines")
        with contextlib.suppress(catalog.MachineSpecError):  # a bad machine: forja_vertex says so below
            gpus = catalog.resolve_gpus(machine, None, None)
            if gpus.gpu_type and gpus.gpu_count:
                accelerator = vertex_accelerator(gpus.gpu_type)
                count = gpus.gpu_count if count is None else count
    return machine, accelerator, count


def worker_pools(options: VertexOptions, task: dict[str, Any], env: dict[str, str]) -> list:
    """The module's worker_pools for this run: the primary, then the other replicas in a second pool
    (Vertex's pool 0 has exactly one replica). ``task``: the pool's python_package or container."""
    machine, accelerator, count = machine_of(options)
    pool: dict[str, Any] = {
        "machine_type": machine,
        "accelerator_type": accelerator,
        "accelerator_count": count,
        **task,
        "env": env,
    }
    if options.replica_count < 1:
        raise errors.ConfigError("replica_count", f"{options.replica_count} is not >= 1 (1: one machine)")
    rest = options.replica_count - 1
    return [{**pool, "replica_count": 1}, *([{**pool, "replica_count": rest}] if rest else [])]


def procs_per_replica(options: VertexOptions, code: OwnCode) -> int:
    """Processes on each replica: --procs, else one per GPU of the machine, else one."""
    if code.procs is not None:
        if isinstance(code.procs, bool) or not isinstance(code.procs, int) or code.procs < 1:
            raise errors.ConfigError("procs", f"{code.procs!r} is not a number >= 1 (omit it: one per GPU)")
        return code.procs
    return machine_of(options)[2] or 1


def task_of(options: VertexOptions, package: str, code: OwnCode | None, runs_url: str) -> dict[str, Any]:
    """What each replica runs: the built-in trainer on the run's config, the user's script under
    trainer.vertex_launch (torchrun, the contract), or the user's image with their arguments."""
    if code is None:
        args = ["train", "--config", CONFIG_NAME, "--out", REPLICA_RUN_DIR,
                "--set", f"checkpoint_bucket={runs_url}"]  # fmt: skip
        module = "trainer"
    elif options.image:
        return {"container": {"image_uri": options.image, "args": list(code.args)}}
    else:
        args = ["--nproc-per-node", str(procs_per_replica(options, code)), "--", str(code.script), *code.args]
        module = LAUNCH_MODULE
    return {"python_package": {"executor_image_uri": options.executor_image, "package_uris": [package],
                               "python_module": module, "args": args}}  # fmt: skip


def contract_env(run_id: str, options: VertexOptions, code: OwnCode | None, runs_url: str) -> dict[str, str]:
    """The run contract every replica gets in its environment (what the job says the same for all;
    trainer.vertex_launch adds the per-replica part, an image's entrypoint reads what it needs)."""
    env = {RUN_ENV: run_id, **REPLICA_ENV}
    if code is not None:
        nproc = procs_per_replica(options, code)
        env.update({BUCKET_ENV: runs_url, "FORJA_NNODES": str(options.replica_count),
                    "FORJA_NPROC_PER_NODE": str(nproc),
                    "FORJA_WORLD_SIZE": str(options.replica_count * nproc)})  # fmt: skip
    return env


def job_body(
    run_id: str, options: VertexOptions, package: str, runs_url: str, code: OwnCode | None = None
) -> dict[str, Any]:
    """The CustomJob body, checked by forja_vertex (catalog, pools, the image's registry) before
    anything is sent. The trainer mirrors to ``runs_url/<run>/``, which is also the job's
    baseOutputDirectory. Several replicas restart together when Vertex restarts one
    (restartJobOnWorkerRestart): a DDP group cannot take back one lost member, and the whole group
    resumes from the bucket's newest checkpoint."""
    vertex = vertex_module()
    params = {
        "display_name": run_id,
        "worker_pools": worker_pools(options, task_of(options, package, code, runs_url),
                                     contract_env(run_id, options, code, runs_url)),
        "base_output_dir": f"{runs_url}/{run_id}/",
        "service_account": options.service_account,
        "timeout": options.job_timeout_s,
        "restart_job_on_worker_restart": options.replica_count > 1,
        "labels": {"forja-run": run_id.lower()[:63]},
    }  # fmt: skip
    try:
        return dict(vertex.custom_job(params))
    except vertex.VertexSpecError as exc:
        field, _, why = str(exc).partition(": ")
        option = field.rsplit(".", 1)[-1].split("[", 1)[0]
        if option == "image_uri":
            raise errors.ConfigError("image", f"{why} (forja train --backend vertex --image URI)") from None
        raise errors.ConfigError(
            option, f"{why} (forja train --backend vertex --machine-type/--accelerator/--accelerator-count)"
        ) from None


# -- the package ---------------------------------------------------------------------------------
def trainer_dir() -> Path:
    import trainer

    return Path(trainer.__file__).parent


def package_files(config: Path) -> dict[str, bytes]:
    """What the sdist of the built-in trainer holds, by path: the trainer package, the config as a
    built-in, pyproject.toml."""
    files = trainer_files()
    files[f"trainer/configs/{CONFIG_NAME}.yaml"] = config.read_bytes()
    files["pyproject.toml"] = pyproject(trainer_requirements(), [])
    return files


def trainer_files() -> dict[str, bytes]:
    root = trainer_dir()
    return {
        f"trainer/{p.relative_to(root).as_posix()}": p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo")
    }


def trainer_requirements() -> list[str]:
    """The trainer's own list (the executor image has PyTorch: only these are installed beside it)."""
    lines = (trainer_dir() / "requirements.txt").read_text().splitlines()
    return [r.strip() for r in lines if r.strip() and not r.lstrip().startswith("#")]


def pyproject(deps: list[str], packages: list[str]) -> bytes:
    """The sdist's pyproject.toml: the trainer (with its data), plus `packages` with every file in them."""
    data = [f'"{name}" = ["*"]' for name in packages]
    return "\n".join([
        "[build-system]", 'requires = ["setuptools>=77"]', 'build-backend = "setuptools.build_meta"', "",
        "[project]", f'name = "{DIST_NAME}"', 'version = "0.0.0"', 'requires-python = ">=3.10"',
        f"dependencies = {json.dumps(deps)}", "",
        "[tool.setuptools.packages.find]", f"include = {json.dumps(['trainer', 'trainer.*', *packages])}", "",
        "[tool.setuptools.package-data]",
        '"trainer" = ["data/*", "*.yaml", "configs/*.yaml", "requirements.txt"]', *data, "",
    ]).encode()  # fmt: skip


def project_package_files(code: OwnCode) -> tuple[dict[str, bytes], list[str]]:
    """What the sdist of a user's own script holds: the trainer (trainer.runlib, the launcher), the
    project packed by forja_bundle exactly as for a VM (the same exclusions, no file that looks like
    a private key, the script required), and the project's requirements.txt as the package's
    dependencies. Returns the files and the project's own requirements. Refuses, naming the fix,
    what would not run on Vertex; uploads nothing."""
    from trainer import vertex_launch

    assert code.project is not None and code.script is not None
    module_utils.load("forja_files")
    bundle = module_utils.load("forja_bundle")
    from forja import host_contract

    prefix = vertex_launch.PROJECT_PREFIX.rstrip("/")
    sources = [{"path": str(code.project), "prefix": prefix}]
    patterns = [*host_contract.value("send_excludes"), *code.excludes]
    packed, _excluded, secrets = bundle.collect(sources, patterns, True)
    problems = bundle.missing_required([f"{prefix}/{code.script}"], packed, secrets, sources, patterns, [])
    if problems:
        raise errors.ConfigError("script", "the project would lack what the run needs: "
                                 + "; ".join(problems))
    archive = io.BytesIO()
    bundle.write_archive(packed, archive)
    requirements = next((path for name, path, _ in packed if name == f"{prefix}/{REQUIREMENTS}"), None)
    deps = project_requirements(Path(requirements)) if requirements else []
    files = trainer_files()
    package = vertex_launch.PROJECT_PACKAGE
    files[f"{package}/__init__.py"] = b'"""The project, packed by forja_bundle (trainer.vertex_launch)."""\n'
    files[f"{package}/{vertex_launch.PROJECT_ARCHIVE}"] = archive.getvalue()
    files["pyproject.toml"] = pyproject([*trainer_requirements(), *deps], [package])
    return files, deps


def project_requirements(path: Path) -> list[str]:
    """The project's requirements.txt as a package's dependencies (PEP 508), each line checked: a pip
    option (-r, -e, --index-url ...) or a file on this machine cannot go with the package to Vertex."""
    from packaging.requirements import InvalidRequirement, Requirement

    deps = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        where = f"{REQUIREMENTS} line {number} ({line!r})"
        if line.startswith("-"):
            raise errors.ConfigError(
                "requirements", f"{where}: a pip option cannot go with the package to Vertex; list the "
                "packages themselves, one per line (e.g. tabulate>=0.9)"
            )
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise errors.ConfigError(
                "requirements", f"{where} is not a requirement ({exc}); write NAME[extras]VERSION, e.g. "
                "tabulate>=0.9,<0.10"
            ) from None
        if req.url and not req.url.startswith(("https://", "http://", "git+https://")):
            raise errors.ConfigError(
                "requirements", f"{where} points at this machine ({req.url}), which Vertex cannot reach; "
                "publish it to an index or put its code in the project"
            )
        deps.append(str(req))
    return deps


def check_requirements_resolve(deps: list[str]) -> None:
    """pip's own resolver (a dry run, nothing installed) on the project's requirements, so one no
    index has, or two that conflict, is refused here rather than by a replica after the job queued.
    It resolves for this machine's Python and platform (Vertex's image has Python 3.10 on Linux): a
    wheel only one of them has still fails there. Run only for a package not yet in the bucket: one
    already there resolved before."""
    if not deps:
        return
    with tempfile.TemporaryDirectory(prefix="forja-vertex-req-") as tmp:
        listed = Path(tmp, REQUIREMENTS)
        listed.write_text("\n".join(deps) + "\n")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-input",
             "--disable-pip-version-check", "-r", str(listed)],
            capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
    if done.returncode != 0 and "No module named pip" not in done.stderr:  # no pip here: Vertex's will say
        lines = done.stderr.splitlines()
        said = [line for line in lines if line.startswith("ERROR")] or lines
        raise errors.ConfigError(
            "requirements", f"the project's {REQUIREMENTS} does not resolve (pip: {' '.join(said)[-600:]}); "
            "fix the names or versions so that `pip install -r requirements.txt` works"
        )


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
