#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Ansible module forja_bundle: a reproducible, secret-free tarball of folders, built on the controller.

The work is done by the action plugin of the same name (plugins/action/forja_bundle.py) inside Ansible's
own process on the controller, where the folders are: it never touches a managed host, so it needs no
module shipped and started (about 1 s of a re-run on the 2-core test machine). This file documents it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: forja_bundle
short_description: Pack folders into a content-addressed tarball, leaving secrets and junk out
description:
  - Packs one or more controller folders into a single C(.tar.gz) whose name is the SHA-256 of its content,
    so an unchanged project gives the same file and a later copy/unarchive reports no change.
  - The archive is reproducible - entries sorted, times, owners and gzip header zeroed, modes normalised to
    0644 or 0755 - so its hash depends on the file contents and names only.
  - Files and folders matching O(excludes) are skipped; with O(detect_secrets) files that hold a private
    key or Google credentials in a known format are skipped too, whatever their name, and reported with
    the kind of key each holds. Source code that only mentions a key (a test with a PEM string) is sent.
  - The archive holds a C(.forja-bundle) manifest (JSON) listing what was packed; roles use it as the
    C(creates) marker when unpacking.
  - "Run it on the controller (C(delegate_to: localhost)); it never reads or writes on managed hosts."
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  sources:
    description:
      - Folders to pack. Each item has C(path) (a folder on the controller) and C(prefix) (the folder it gets
        inside the archive). A missing folder is an error that names it.
    type: list
    elements: dict
    required: true
  excludes:
    description:
      - Glob patterns to leave out. A pattern without C(/) matches any file or folder name at any depth
        (C(.git), C(*.pem)); one with C(/) matches the path relative to the source folder (C(data/raw/*)).
        An excluded folder is not descended into.
    type: list
    elements: str
    default: []
  detect_secrets:
    description:
      - Also leave out files that hold a private key or Google credentials, by their content in the first
        64 KiB - a line that opens a PEM, OpenSSH, PGP or PuTTY private key, or a JSON file of Google
        credentials (a service-account key, user credentials with a refresh token).
    type: bool
    default: true
  dest:
    description:
      - Controller folder for bundles; created with mode 0700 when missing.
    type: path
    required: true
  required:
    description:
      - Archive paths (C(prefix/relative/path)) that must be in the bundle, such as the script a run executes.
      - One that is missing from its folder, or left out by O(excludes) or O(detect_secrets), fails the module
        before any bundle is written, with a message naming the file and why.
    type: list
    elements: str
    default: []
  required_executable:
    description:
      - Archive paths that must be in the bundle, as O(required), and executable (an x bit in their mode),
        such as a run's hook scripts. One without its x bit fails the module before any bundle is written,
        naming the C(chmod +x) that fixes it.
    type: list
    elements: str
    default: []
  verify_only:
    description:
      - Only walk the folders and check O(required), without building or writing an archive (a cheap check
        a role can make before it changes anything on a host). RV(path), RV(name) and RV(sha256) are empty.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Pack the trainer and the project
  forja.gpu.forja_bundle:
    sources:
      - {path: "{{ playbook_dir }}/../trainer", prefix: trainer}
      - {path: ~/my-project, prefix: project}
    excludes: [.git, .env, "*.pem", __pycache__]
    dest: ~/.cache/forja/bundles
    required: [project/train.py]  # the script the run executes must be sent
  delegate_to: localhost
  become: false
  register: bundle

- name: Say what will be sent
  ansible.builtin.debug:
    msg: "{{ bundle.files }} files, {{ bundle.size_human }}; {{ bundle.excluded }} left out"
"""

RETURN = r"""
path:
  description: Absolute path of the bundle on the controller.
  returned: always
  type: str
  sample: /root/.cache/forja/bundles/bundle-3f2a9c1d0b7e4a51.tar.gz
name:
  description: File name of the bundle.
  returned: always
  type: str
  sample: bundle-3f2a9c1d0b7e4a51.tar.gz
sha256:
  description: SHA-256 of the archive; its first 16 hex digits name the file.
  returned: always
  type: str
sha1:
  description:
    - SHA-1 of the archive, as ansible's copy module and P(forja.gpu.host_state#module) compute it, so a role
      can tell in one call whether the host already has this bundle.
  returned: always
  type: str
files:
  description: Number of files packed (the manifest not counted).
  returned: always
  type: int
  sample: 42
bytes:
  description: Total size of the packed files before compression.
  returned: always
  type: int
size_human:
  description: RV(bytes) for people (KiB, MiB).
  returned: always
  type: str
  sample: 1.3 MiB
excluded:
  description: Number of files and folders left out (an excluded folder counts once).
  returned: always
  type: int
excluded_sample:
  description: Up to 20 of the paths left out, as C(prefix/relative/path).
  returned: always
  type: list
  elements: str
secrets_excluded:
  description: Paths left out because their content is a private key or Google credentials.
  returned: always
  type: list
  elements: str
secrets_why:
  description: RV(secrets_excluded), each followed by the kind of key it holds, for people.
  returned: always
  type: list
  elements: str
  sample: ["project/keys/deploy (its content is an OpenSSH private key)"]
"""
