"""One Vertex AI replica of a user's own script.

``python -m trainer.vertex_launch --nproc-per-node N -- SCRIPT ARGS``

Why: on a forja VM, roles/trainer_run/files/forja-train-launch unpacks nothing (the project is sent
as a folder) and runs the script under torchrun with forja's run contract in its environment. A
Vertex replica has none of that: it pip-installs the run's package (this trainer, the project as
forja_bundle packed it in ``forja_project/project.tar.gz``, and the project's requirements) into
Vertex's prebuilt PyTorch image and runs one Python module. This module is that module, and does
what the VM's launcher does, so a script on ``trainer.runlib`` cannot tell the two apart:

* the project is unpacked into ``./forja-project`` (the replica's working folder) and the script
  runs from there under torchrun: one process per GPU (``--nproc-per-node``), one node per replica,
  node 0's address and port from Vertex's ``MASTER_ADDR``/``MASTER_PORT`` (Vertex's prebuilt PyTorch
  images set them; ``CLUSTER_SPEC`` otherwise), this replica's node rank from ``CLUSTER_SPEC``;
* the run contract: ``FORJA_RUN`` (the job's env), ``FORJA_RUN_DIR`` (``./forja-run``),
  ``FORJA_CHECKPOINT_DIR`` (its ``checkpoints``), mirrored by trainer.runlib to the bucket named by
  ``FORJA_CHECKPOINT_BUCKET`` (the job's env: ``gs://BUCKET/vertex/runs``, so checkpoints land in
  ``<run>/checkpoints/``, Vertex's AIP_CHECKPOINT_DIR, and the logs and summary.json in
  ``<run>/logs/``), ``FORJA_RESUME_FROM`` (the newest verified checkpoint, pulled from the bucket
  first: a job Vertex restarted on fresh disks resumes from there), ``FORJA_NNODES``,
  ``FORJA_NODE_RANK``, ``FORJA_NPROC_PER_NODE``, ``FORJA_WORLD_SIZE``, ``FORJA_PROJECT_DIR``;
* a completed run's ``model/`` (in the run folder, where a script exports its model and where forja
  fetches it from on a VM) is uploaded to Vertex's AIP_MODEL_DIR, the run's ``model/`` in the bucket;
* SIGTERM (Vertex's preemption or cancel) goes to torchrun, which hands it to every worker; the
  replica exits with the first failing worker's own code (torchrun itself says only 1), so
  trainer.exit_codes reach Vertex's error message ("exited with a non-zero status of 7").

Standard library and the trainer only: it runs on the replica, not on forja's controller.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

#: The package (in the run's sdist) that holds the project's archive, and the archive's name.
PROJECT_PACKAGE = "forja_project"
PROJECT_ARCHIVE = "project.tar.gz"
#: The archive's folder of the project's files (forja_bundle's source prefix) and its manifest.
PROJECT_PREFIX = "project/"
#: Folders in the replica's working folder: the unpacked project, and the run folder.
PROJECT_DIR = "forja-project"
RUN_DIR = "forja-run"
#: Where each worker notes its exit status (``<ns> <rank> <rc>``), for the replica's own exit code.
EXITS = ".forja-exits"


def node_of(env: dict[str, str]) -> tuple[int, int, str, int]:
    """(nodes, this node's rank, node 0's address, its port) from Vertex's environment.

    CLUSTER_SPEC lists every pool's replicas in order (workerpool0 is the primary); a replica's
    node rank is its place in that order. Without it (a run outside Vertex), one node.
    """
    spec = json.loads(env.get("CLUSTER_SPEC") or "{}")
    cluster = spec.get("cluster") or {}
    order = [(pool, i) for pool in sorted(cluster) for i in range(len(cluster[pool]))]
    task = spec.get("task") or {}
    me = (task.get("type", "workerpool0"), int(task.get("index", 0)))
    rank = order.index(me) if me in order else 0
    first = (cluster.get("workerpool0") or ["127.0.0.1:29500"])[0]
    host, _colon, port = first.rpartition(":")
    return max(1, len(order)), rank, env.get("MASTER_ADDR") or host, int(env.get("MASTER_PORT") or port)


def unpack_project(dest: Path) -> Path:
    """The project as forja_bundle packed it, unpacked into `dest` (replaced: a restarted replica
    starts from the package, as a fresh VM's disk would)."""
    import importlib.util

    found = importlib.util.find_spec(PROJECT_PACKAGE)
    if found is None or not found.submodule_search_locations:
        raise SystemExit(f"forja: the run's package has no {PROJECT_PACKAGE}; was it built by forja?")
    archive = Path(next(iter(found.submodule_search_locations))) / PROJECT_ARCHIVE
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(PROJECT_PREFIX) and m.isfile()]
        for member in members:
            member.name = member.name[len(PROJECT_PREFIX) :]
        if hasattr(tarfile, "data_filter"):  # Python 3.10.12+: no path outside dest, no odd modes
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - older Pythons; the names were written by forja_bundle
            tar.extractall(dest, members=members)
    return dest


def contract(env: dict[str, str], work: Path, nodes: int, node_rank: int, nproc: int) -> dict[str, str]:
    """The run contract of forja-train-launch, for this replica (see the module docstring)."""
    run_dir = Path(env.get("FORJA_RUN_DIR") or work / RUN_DIR)
    out = {
        **env,
        "FORJA_RUN_DIR": str(run_dir),
        "FORJA_CHECKPOINT_DIR": env.get("FORJA_CHECKPOINT_DIR") or str(run_dir / "checkpoints"),
        "FORJA_NNODES": str(nodes),
        "FORJA_NODE_RANK": str(node_rank),
        "FORJA_NPROC_PER_NODE": str(nproc),
        "FORJA_WORLD_SIZE": str(nodes * nproc),
        "FORJA_PROJECT_DIR": str(work / PROJECT_DIR),
    }
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):  # Vertex's per-replica figures: torchrun sets its own
        out.pop(name, None)
    return out


def resume_point(env: dict[str, str]) -> str:
    """The newest verified checkpoint (pulled from the bucket when it is newer), as the VM's launcher
    finds it: ``python -m trainer.runlib resume-point DIR``."""
    done = subprocess.run(
        [sys.executable, "-m", "trainer.runlib", "resume-point", env["FORJA_CHECKPOINT_DIR"]],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        print(f"forja: no resume point ({done.stderr.strip()[-500:]})", file=sys.stderr, flush=True)
        return ""
    return done.stdout.strip()


def torchrun(nodes: int, node_rank: int, addr: str, port: int, nproc: int) -> list[str]:
    """torchrun's command for this node: standalone for one, a static rendezvous at node 0 for more."""
    base = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--max_restarts=0"]
    if nodes == 1:
        return [*base, "--nnodes=1", "--standalone"]
    return [*base, f"--nnodes={nodes}", f"--node_rank={node_rank}", f"--master_addr={addr}",
            f"--master_port={port}"]  # fmt: skip


def worker(argv: list[str]) -> int:
    """One torchrun worker: the script with the run's Python, its exit status noted for the replica."""
    child = subprocess.Popen([sys.executable, *argv])
    signal.signal(signal.SIGTERM, lambda *_signal: child.send_signal(signal.SIGTERM))
    rc = child.wait()
    with open(Path(os.environ["FORJA_RUN_DIR"]) / EXITS, "a") as notes:
        notes.write(f"{time.time_ns()} {os.environ.get('RANK', '0')} {rc}\n")
    return rc


def upload_model(run_dir: Path, model_url: str) -> list[str]:
    """The run folder's ``model/`` (what a script exports there, as the built-in trainer does, and
    what forja fetches from a VM) uploaded to Vertex's AIP_MODEL_DIR (``<baseOutputDirectory>/model/``
    in the run's bucket prefix); the names uploaded. Nothing when there is no model or no gs:// URL."""
    from trainer.gcs import parse_bucket_url, storage_client
    from trainer.run_folder import MODEL_DIR

    folder = run_dir / MODEL_DIR
    if not folder.is_dir() or not model_url.startswith("gs://"):
        return []
    bucket_name, prefix = parse_bucket_url(model_url)
    bucket = storage_client().bucket(bucket_name)
    sent = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        name = f"{prefix}/{rel}" if prefix else rel
        bucket.blob(name).upload_from_filename(str(path))
        sent.append(name)
    return sent


def first_failure(run_dir: Path) -> int | None:
    """The first failing worker's own exit status, or None."""
    path = run_dir / EXITS
    rows = sorted(line.split() for line in path.read_text().splitlines()) if path.is_file() else []
    return next((int(rc) for _when, _rank, rc in rows if rc != "0"), None)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer.vertex_launch", description=__doc__.splitlines()[0])
    p.add_argument("--nproc-per-node", type=int, default=1, help="processes on this replica (one per GPU)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the script (in the project) and its arguments")
    args = p.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        p.error("give the script to run, e.g. -- train.py --steps 100")
    return args


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.worker:
        return worker(args.command)
    # The replica's working folder when it may write there (the emulator's, a container's WORKDIR), else /tmp.
    work = Path.cwd() if os.access(Path.cwd(), os.W_OK) else Path(tempfile.gettempdir()) / "forja"
    nodes, node_rank, addr, port = node_of(dict(os.environ))
    env = contract(dict(os.environ), work, nodes, node_rank, args.nproc_per_node)
    project = unpack_project(work / PROJECT_DIR)
    run_dir = Path(env["FORJA_RUN_DIR"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / EXITS).unlink(missing_ok=True)
    env["FORJA_RESUME_FROM"] = resume_point(env)
    script, *rest = args.command
    cmd = [*torchrun(nodes, node_rank, addr, port, args.nproc_per_node), "--no-python", sys.executable,
           "-m", "trainer.vertex_launch", "--worker", "--", str(project / script), *rest]  # fmt: skip
    print(f"forja: starting run {env.get('FORJA_RUN', '?')} (node {node_rank} of {nodes}, "
          f"{args.nproc_per_node} process(es) here): {script} {' '.join(rest)}"
          f"{'; resume point ' + env['FORJA_RESUME_FROM'] if env['FORJA_RESUME_FROM'] else ''}", flush=True)
    # The workers import the project's modules (model.py) from its folder, the trainer from the package.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(project), env.get("PYTHONPATH", "")) if p)
    child = subprocess.Popen(cmd, cwd=project, env=env)
    signal.signal(signal.SIGTERM, lambda *_signal: child.send_signal(signal.SIGTERM))
    rc = child.wait()
    if rc != 0:
        rc = first_failure(run_dir) or rc
    elif node_rank == 0:
        for name in upload_model(run_dir, env.get("AIP_MODEL_DIR", "")):
            print(f"forja: uploaded {name}", flush=True)
    print(f"forja: run {env.get('FORJA_RUN', '?')} {'completed' if rc == 0 else f'exited with {rc}'} "
          f"on node {node_rank}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
