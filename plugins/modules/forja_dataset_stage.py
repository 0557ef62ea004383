#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Ansible module forja_dataset_stage: a pushed dataset copied from its bucket onto the host's disk."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: forja_dataset_stage
short_description: Copy a pushed dataset from Cloud Storage onto the host's local disk, verified
description:
  - Makes O(dest)C(/)O(name) hold exactly the dataset that M(forja.gpu.forja_dataset_push) (or
    C(forja data push)) wrote to C(gs://BUCKET/datasets/NAME), for fast local reads by a run.
  - Each file already on the host is hashed and compared with the manifest's SHA-256; only missing or
    altered files are fetched (to a temporary name, verified, then renamed), and files the manifest does
    not list are removed. A second run changes nothing; a deleted or altered file is put back.
  - The staged copy of the manifest (C(.forja-dataset.json)) is removed first and written last, so a
    staging cut short never looks complete.
  - The space the missing files need is checked against the free space of O(dest)'s disk before anything
    changes; too little fails naming what is needed and how to grow the disk.
  - With O(manifest) instead of O(bucket), checks a dataset sent straight to the host (the dataset role's
    rsync path, no bucket) - O(phase=prepare) before the transfer (space, files to send, stray files removed,
    marker removed), O(phase=verify) after it (every SHA-256, then the marker).
  - Runs on the host with its own Python and the standard library only. On a GCE VM it reads the bucket
    with the VM's service account (a token from the metadata server); with O(storage_emulator_host) it
    reads that emulator without credentials.
version_added: "0.2.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  bucket:
    description: The bucket, as C(gs://BUCKET) or C(BUCKET). One of O(bucket) and O(manifest) is needed.
    type: str
  manifest:
    description: A manifest file on the host, for a dataset sent straight to it (no bucket).
    type: path
  phase:
    description: With O(manifest), the step around the transfer.
    type: str
    choices: [prepare, verify]
    default: verify
  name:
    description: The dataset's name (as pushed).
    type: str
    required: true
  dest:
    description:
      - Host folder of staged datasets (C(host_contract_data_dir)).
      - The dataset lands in a folder named O(name) under it.
    type: path
    required: true
  threads:
    description: Parallel downloads (and hashing threads).
    type: int
    default: 8
  request_timeout:
    description: Seconds to wait for one HTTP answer.
    type: float
    default: 60.0
  storage_emulator_host:
    description: A Cloud Storage emulator instead of Google's endpoint, read without credentials.
    type: str
  metadata_token_url:
    description: Where the VM's access token comes from (the GCE metadata server's).
    type: str
    default: http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Stage the dataset on the host's disk
  forja.gpu.forja_dataset_stage:
    bucket: gs://my-project-forja-data
    name: digits-v2
    dest: "{{ host_contract_data_dir }}"
  become: true
"""

RETURN = r"""
dest:
  description: The staged dataset's folder on the host.
  returned: success
  type: str
  sample: /var/lib/forja/data/digits-v2
files:
  description: Files in the dataset.
  returned: success
  type: int
total_size:
  description: Their total size in bytes.
  returned: success
  type: int
downloaded:
  description:
    - Paths fetched this time (missing or altered on the host).
    - With O(phase=prepare), the paths to send.
  returned: success
  type: list
  elements: str
downloaded_bytes:
  description: Bytes fetched this time.
  returned: success
  type: int
removed:
  description: Paths removed because the manifest does not list them.
  returned: success
  type: list
  elements: str
marker_written:
  description: Whether the staged manifest copy was (re)written.
  returned: success
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_dataset import (
    METADATA_TOKEN_URL,
    DatasetError,
    bucket_from_url,
    stage,
    stage_local,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "bucket": {"type": "str"},
            "manifest": {"type": "path"},
            "phase": {"type": "str", "choices": ["prepare", "verify"], "default": "verify"},
            "name": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "threads": {"type": "int", "default": 8},
            "request_timeout": {"type": "float", "default": 60.0},
            "storage_emulator_host": {"type": "str"},
            # A URL that hands out tokens, not a token: nothing to hide.
            "metadata_token_url": {"type": "str", "default": METADATA_TOKEN_URL, "no_log": False},
        },
        required_one_of=[("bucket", "manifest")],
        mutually_exclusive=[("bucket", "manifest")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["manifest"]:
            local = stage_local(params["manifest"], params["name"], params["dest"], params["phase"],
                                threads=params["threads"], check_mode=module.check_mode)
            module.exit_json(**local.as_dict())
        raw = params["bucket"]
        bucket = bucket_from_url(raw if raw.startswith("gs://") else f"gs://{raw}")
        result = stage(
            bucket, params["name"], params["dest"], emulator=params["storage_emulator_host"] or None,
            threads=params["threads"], check_mode=module.check_mode, timeout=params["request_timeout"],
            token_url=params["metadata_token_url"],
        )  # fmt: skip
    except DatasetError as exc:
        module.fail_json(msg=exc.message, field=exc.field, changed=False)
    module.exit_json(**result.as_dict())


if __name__ == "__main__":
    main()
