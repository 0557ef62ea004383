#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Ansible module forja_dataset_push: a controller folder to a bucket as a content-addressed dataset."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: forja_dataset_push
short_description: Push a dataset folder to Cloud Storage, content-addressed, verified, resumable
description:
  - Sends the files of O(src) to C(gs://BUCKET/datasets/blobs/<sha256>) (one object per distinct content)
    and then writes C(gs://BUCKET/datasets/NAME/manifest.json) listing each file's path, size, SHA-256 and
    CRC32C. The manifest is written last, so an interrupted push never looks complete.
  - A blob that is already in the bucket with the same size and CRC32C is not sent again, so a second push
    sends only what changed, and a push that was interrupted resumes where it stopped. Large files go up
    as resumable uploads in chunks; uploads run in O(threads) parallel threads.
  - Every upload carries its CRC32C, which Cloud Storage checks against the bytes it received, and the
    object it reports is compared again; a mismatch fails naming the file.
  - Leaves out what the bundle (M(forja.gpu.forja_bundle)) leaves out - O(excludes) and, with
    O(detect_secrets), files that look like private keys or service-account keys - by the same code.
  - Bad input fails before anything is written - a missing or unreadable folder, a bad name, a bucket
    these credentials may not use (403) or that does not exist.
  - Without O(bucket), only plans a push straight to a host's disk - hashes the folder and writes its manifest
    to O(plan_dir) - for the dataset role's rsync path; nothing is sent and nothing changes.
  - "Runs on the controller (C(delegate_to: localhost)). The same code is C(forja data push)."
version_added: "0.2.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - forja.gpu.gcp_auth
  - forja.gpu.gcp_auth.modules
  - forja.gpu.gcp_auth.storage
options:
  src:
    description: The dataset folder on the controller.
    type: path
    required: true
  name:
    description: The dataset's name (1-63 letters, digits, C(.), C(_), C(-)); default the folder's name.
    type: str
  bucket:
    description:
      - The bucket, as C(gs://BUCKET) or C(BUCKET).
      - Empty plans a push straight to a host (O(plan_dir)).
    type: str
    default: ""
  plan_dir:
    description: Controller folder for the manifest of a push without a bucket (created with mode 0700).
    type: path
  excludes:
    description:
      - Glob patterns to leave out; a pattern without C(/) matches a name at any depth, one with C(/) the
        relative path. The dataset role passes the host contract's C(host_contract_send_excludes) plus
        its own C(dataset_excludes).
    type: list
    elements: str
    default: []
  detect_secrets:
    description: Also leave out files whose first 64 KiB look like a private key or a service-account key.
    type: bool
    default: true
  threads:
    description: Parallel uploads (and hashing threads).
    type: int
    default: 8
  retry_deadline:
    description: Seconds one blob's upload is retried (5xx, 429, dropped connections) before the push fails.
    type: float
    default: 300.0
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - Needs google-cloud-storage on the controller (a dependency of forja).
  - The credentials need C(roles/storage.objectAdmin) on the bucket.
"""

EXAMPLES = r"""
- name: Push the dataset
  forja.gpu.forja_dataset_push:
    src: ~/data/digits
    name: digits-v2
    bucket: gs://my-project-forja-data
    excludes: "{{ host_contract_send_excludes }}"
  delegate_to: localhost
  run_once: true
  register: pushed

- name: Say what was sent
  ansible.builtin.debug:
    msg: "{{ pushed.uploaded_files }} of {{ pushed.files }} files sent, {{ pushed.url }}"
"""

RETURN = r"""
url:
  description: The dataset's URL (a run names it in its data_args).
  returned: success
  type: str
  sample: gs://my-project-forja-data/datasets/digits-v2
manifest_url:
  description: Where the manifest is.
  returned: success
  type: str
files:
  description: Files in the dataset.
  returned: success
  type: int
total_size:
  description: Their total size in bytes.
  returned: success
  type: int
uploaded_files:
  description: Distinct contents sent this time (0 when the bucket had them all).
  returned: success
  type: int
uploaded_bytes:
  description: Bytes sent this time.
  returned: success
  type: int
skipped_files:
  description: Distinct contents the bucket already had.
  returned: success
  type: int
manifest_path:
  description: Without a bucket, the manifest written to O(plan_dir) (path, size, SHA-256, CRC32C per file).
  returned: when bucket is empty
  type: str
src:
  description: Without a bucket, the dataset folder, resolved.
  returned: when bucket is empty
  type: str
manifest_written:
  description: Whether the manifest was written (false when the bucket's already listed exactly these files).
  returned: success
  type: bool
excluded:
  description: Paths left out (an excluded folder once, with a trailing C(/)).
  returned: success
  type: list
  elements: str
secrets_excluded:
  description: Paths left out because their content looks like a private key or a service-account key.
  returned: success
  type: list
  elements: str
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_dataset import (
    DatasetError,
    bucket_from_url,
    plan,
    push,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp import (
    AUTH_ARGUMENT_SPEC,
    GcpError,
    config_from_params,
)
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_instance import SpecError
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_storage import emulator_host, make_client


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "name": {"type": "str"},
            "bucket": {"type": "str", "default": ""},
            "plan_dir": {"type": "path"},
            "excludes": {"type": "list", "elements": "str", "default": []},
            "detect_secrets": {"type": "bool", "default": True},
            "threads": {"type": "int", "default": 8},
            "retry_deadline": {"type": "float", "default": 300.0},
            "storage_emulator_host": {"type": "str"},
            **AUTH_ARGUMENT_SPEC,
        },
        mutually_exclusive=[("credentials_file", "credentials_json")],
        supports_check_mode=False,
    )
    params: dict[str, Any] = module.params
    try:
        raw = params["bucket"]
        name = params["name"] or os.path.basename(os.path.normpath(params["src"]))
        if not raw:
            if not params["plan_dir"]:
                raise DatasetError("plan_dir", "needed without a bucket (where the manifest is written)")
            planned = plan(params["src"], name, params["excludes"], params["detect_secrets"],
                           params["threads"], params["plan_dir"])
            module.exit_json(changed=False, **planned)
        bucket = bucket_from_url(raw if raw.startswith("gs://") else f"gs://{raw}")
        config = config_from_params(params, "forja-dataset-push/0.2")
        client = make_client(config, emulator_host(params, dict(config.env)))
        result = push(
            client, bucket, name, params["src"], params["excludes"], params["detect_secrets"],
            threads=params["threads"], request_timeout=float(params["request_timeout"]),
            retry_deadline=float(params["retry_deadline"]),
        )  # fmt: skip
    except DatasetError as exc:
        module.fail_json(msg=exc.message, field=exc.field, changed=False)
    except (SpecError, GcpError) as exc:
        module.fail_json(msg=str(getattr(exc, "message", exc)), changed=False)
    module.exit_json(changed=result.uploaded_files > 0 or result.manifest_written, **result.as_dict())


if __name__ == "__main__":
    main()
