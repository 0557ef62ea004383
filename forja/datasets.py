"""`forja data push`: a dataset to the project's bucket, or straight to the VM's disk.

The push itself lives in one home, ``plugins/module_utils/forja_dataset.py``, which the Ansible
module forja.gpu.forja_dataset_push (role forja.gpu.dataset) runs too; forja loads that file by
path, as it loads the machine catalog (forja/machines.py), so both sides send the same bytes under
the same names and leave out the same files (the bundle's excludes and secret check,
``forja_files.py``). forja imports no plugin code as a package.

Without a bucket the data goes to <host_contract_data_dir>/<NAME> on each VM through
playbooks/data.yml (roles/dataset): rsync over the SSH settings Ansible templates from the
inventory (key, user, an IAP ProxyCommand), because it sends only what differs and keeps partly
sent files for the next try; the host checks the space first, every file's SHA-256 after, and
writes the manifest last.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from forja import consent, defaults, errors, module_utils

if TYPE_CHECKING:
    from forja.session import Session

#: google-cloud-storage's own setting for an emulator's endpoint (the sandbox's Cloud Storage).
ENV_EMULATOR = "STORAGE_EMULATOR_HOST"
#: Parallel uploads of a push unless told otherwise (kept where `forja --help` reads it cheaply).
PUSH_THREADS = defaults.PUSH_THREADS


def dataset_module() -> ModuleType:
    """forja_dataset.py, loaded once (its sibling forja_files.py first: it imports that by name)."""
    module_utils.load("forja_files")
    return module_utils.load("forja_dataset", "forja._dataset_push")


def first_host_vars(forja: Session) -> dict[str, Any]:
    """The first forja_gpu host's inventory variables (where the project's bucket is named), or {}."""
    if forja.inventory is None:
        return {}
    hosts = forja.hosts()
    return dict(hosts[0].vars) if hosts else {}


def settings(forja: Session, bucket: str | None) -> dict[str, Any]:
    """Where a push goes: the bucket given, else `dataset_bucket` (an -e or the inventory), else the
    inventory's checkpoint bucket `gcp_bucket_name`; the emulator from STORAGE_EMULATOR_HOST, else
    the inventory's (the sandbox names its own); the project from FORJA_GCP_PROJECT or the inventory."""
    given = dict(forja.extravars)
    hostvars = {} if bucket and os.environ.get(ENV_EMULATOR) else first_host_vars(forja)
    # The inventory as written, not templated (ansible-inventory --list): a value that refers to
    # another ("gs://{{ gcp_bucket_name }}", the sandbox's) is read through the one it names.
    merged = {k: v for k, v in {**hostvars, **given}.items() if not (isinstance(v, str) and "{{" in v)}
    url = bucket or merged.get("dataset_bucket") or (
        f"gs://{merged['gcp_bucket_name']}" if merged.get("gcp_bucket_name") else "")
    emulator = (os.environ.get(ENV_EMULATOR) or merged.get("dataset_storage_emulator_host")
                or merged.get("gcp_bucket_storage_emulator_host") or None)
    project = (os.environ.get("FORJA_GCP_PROJECT") or merged.get("gcp_bucket_project")
               or merged.get("dataset_project"))
    return {"bucket": url, "emulator": emulator, "project": project or None,
            "credentials_file": os.environ.get("FORJA_GCP_CREDENTIALS_FILE") or None}


def storage_client(session: Session, bucket_url: str) -> Any:
    """A Cloud Storage client as `forja data push` makes one (the inventory's emulator, project, key)."""
    where = settings(session, bucket_url)
    return dataset_module().make_client(where["project"], where["emulator"], where["credentials_file"])


def push(
    forja: Session,
    path: str | Path,
    name: str | None = None,
    bucket: str | None = None,
    *,
    threads: int = PUSH_THREADS,
    excludes: Sequence[str] = (),
    detect_secrets: bool = True,
    retry_deadline_s: float = 300.0,
    on_progress: Callable[[Any], None] | None = None,
    to_host: bool = False,
    yes: bool = False,
    ask: Callable[[str], bool] | None = None,
    say: Callable[[str], None] | None = None,
) -> Any:
    """Push a dataset folder to the project's bucket as gs://BUCKET/datasets/NAME (NAME: the folder's).

    Content-addressed: each distinct file goes to gs://BUCKET/datasets/blobs/<sha256> once, so a second
    push sends only what changed and an interrupted push resumes by skipping what is there. Uploads run
    in parallel (large files resumable, in chunks), each checked against its CRC32C; the manifest (path,
    size, SHA-256, CRC32C per file) is written last, so a partial push never looks complete. Secrets are
    left out as in the bundle (host_contract_send_excludes, plus the content check). The bucket is
    --bucket, else the inventory's dataset_bucket or gcp_bucket_name. `on_progress` gets a Progress
    (phase, files and bytes done and in all) as it goes; no clock of forja's stops a long push, only one
    blob left unanswered past `retry_deadline_s` of retries does (push again: what was sent is kept).
    Runs on the hosts read it as gs://BUCKET/datasets/NAME, or staged on their disk (roles/dataset).
    Without a bucket (or with --to-host), the folder goes straight to <host_contract_data_dir>/NAME on
    the VMs (rsync over the inventory's SSH, each file's SHA-256 checked there; a RunResult is returned).
    Before anything is sent, what will go is said (`say`) and the inventory's forja_upload_consent
    applies, as for `train` (forja/consent.py: `ask` is the question for a person, `yes` skips it).
    """
    from forja import host_contract

    mod = dataset_module()
    folder = Path(path).expanduser()
    dataset = name or folder.resolve().name
    try:
        mod.check_source(str(folder))
        mod.check_name(dataset)
    except mod.DatasetError as exc:
        raise errors.ConfigError(exc.field, exc.message.split(": ", 1)[1]) from None
    where = {"bucket": ""} if to_host else settings(forja, bucket)
    going = f"the dataset {dataset} to {where['bucket'] or 'the VMs, straight to their disk'}"
    consent.obtain(forja, consent.survey(folder.resolve(), excludes, going), yes=yes, ask=ask, say=say)
    if not where["bucket"]:
        if forja.inventory is None:
            raise errors.ConfigError("bucket", "no bucket and no inventory: give --bucket gs://BUCKET, or "
                                               "-i INVENTORY to send the dataset straight to the VM's disk")
        return forja.run("data.yml", {
            "dataset_src": str(folder.resolve()), "dataset_name": dataset, "dataset_bucket": "",
            "dataset_excludes": list(excludes), "dataset_detect_secrets": detect_secrets,
            "dataset_threads": threads})
    try:
        bucket_name = mod.bucket_from_url(where["bucket"])
        client = mod.make_client(where["project"], where["emulator"], where["credentials_file"])
        return mod.push(
            client, bucket_name, dataset, str(folder),
            [*host_contract.value("send_excludes"), *excludes], detect_secrets,
            threads=threads, on_progress=on_progress, retry_deadline=retry_deadline_s,
        )  # fmt: skip
    except mod.TransferError as exc:
        raise errors.ForjaError(exc.message) from None
    except mod.DatasetError as exc:
        raise errors.ConfigError(exc.field, exc.message.split(": ", 1)[1]) from None


def deletion_after_run(
    session: Session, config: Path | None, *, bucket_copy: bool, asked: bool = True
) -> dict[str, str]:
    """`--delete-data-after [--delete-bucket-copy]` as trainer_run's variables: the run's dataset is
    its config's `data_args.source` (a folder staged under the host's data folder, or
    gs://BUCKET/datasets/NAME); the host removes it when the run completed and exported its model
    (trainer/data_cleanup.py). ConfigError, before anything is sent, when the run names no dataset."""
    import yaml

    from forja import host_contract

    if not asked:
        if bucket_copy:
            raise errors.ConfigError("--delete-bucket-copy", "goes with --delete-data-after; add it")
        return {}
    source = ""
    if config is not None:
        with open(config) as fh:
            data = yaml.safe_load(fh)
        args = data.get("data_args") if isinstance(data, dict) else None
        source = str(args.get("source") or "") if isinstance(args, dict) else ""
    data_dir = str(host_contract.value("data_dir")).rstrip("/")
    named = source.startswith("gs://") or source.startswith(data_dir + "/")
    if not named:
        raise errors.ConfigError(
            "--delete-data-after", f"the run names no dataset to delete: its config's data_args.source is "
            f"{source or 'not set'}; it must be a dataset pushed with forja data push "
            f"(gs://BUCKET/datasets/NAME, or {data_dir}/NAME on the VM). Leave --delete-data-after out "
            "for a run without one")
    if source.startswith("gs://"):
        name = source.rstrip("/").rsplit("/", 1)[-1]
        return {"trainer_run_delete_data": f"{data_dir}/{name}",
                "trainer_run_delete_bucket_copy": source.rstrip("/") if bucket_copy else ""}
    name = source[len(data_dir) + 1:].split("/", 1)[0]
    bucket = settings(session, None)["bucket"].rstrip("/") if bucket_copy else ""
    if bucket_copy and not bucket:
        raise errors.ConfigError("--delete-bucket-copy", "no bucket to delete the copy from: the inventory "
                                 "names no dataset_bucket or gcp_bucket_name")
    return {"trainer_run_delete_data": f"{data_dir}/{name}",
            "trainer_run_delete_bucket_copy": f"{bucket}/datasets/{name}" if bucket_copy else ""}
