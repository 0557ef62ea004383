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
from typing import Any

from forja import errors, module_utils

#: google-cloud-storage's own setting for an emulator's endpoint (the sandbox's Cloud Storage).
ENV_EMULATOR = "STORAGE_EMULATOR_HOST"


def dataset_module() -> ModuleType:
    """forja_dataset.py, loaded once (its sibling forja_files.py first: it imports that by name)."""
    module_utils.load("forja_files")
    return module_utils.load("forja_dataset", "forja._dataset_push")


def first_host_vars(forja: Any) -> dict[str, Any]:
    """The first forja_gpu host's inventory variables (where the project's bucket is named), or {}."""
    if forja.inventory is None:
        return {}
    hosts = forja.hosts()
    return dict(hosts[0].vars) if hosts else {}


def settings(forja: Any, bucket: str | None) -> dict[str, Any]:
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


def push(
    forja: Any,
    path: str | Path,
    name: str | None,
    bucket: str | None,
    *,
    threads: int,
    excludes: Sequence[str],
    detect_secrets: bool,
    retry_deadline_s: float,
    on_progress: Callable[[Any], None] | None,
    direct: bool = False,
) -> Any:
    """`Forja.push_data`'s work (see its docstring); module errors become forja's typed errors.

    No bucket (none given or in the inventory, or `direct`): playbooks/data.yml sends the folder
    straight to the hosts' disks (roles/dataset, rsync over the inventory's SSH) and its RunResult
    is returned; otherwise the push's PushResult."""
    from forja import host_contract

    mod = dataset_module()
    folder = Path(path).expanduser()
    dataset = name or folder.resolve().name
    try:
        mod.check_source(str(folder))
        mod.check_name(dataset)
    except mod.DatasetError as exc:
        raise errors.ConfigError(exc.field, exc.message.split(": ", 1)[1]) from None
    where = {"bucket": ""} if direct else settings(forja, bucket)
    if not where["bucket"]:
        if forja.inventory is None:
            raise errors.ConfigError("bucket", "no bucket and no inventory: give --bucket gs://BUCKET, or "
                                               "-i INVENTORY to send the dataset straight to the VM's disk")
        return forja._run("data.yml", {
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
