#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""Everything a role needs to know about a host's state, asked in one remote call (read-only).

Why a module: a role that checks each package, folder, file, pip requirement and service with its
own task makes one remote call per thing, 0.2-0.4 s each, on every run, even when nothing has
changed; a re-run of site.yml took ~30x a play that only connects. One call that reports what is
missing or different lets the roles run their install and repair tasks only for that, and skip
them (no remote call) when the host is as it should be. The comparisons are the ones the repair
modules make (dpkg state, owner/group/mode, SHA-1 of the content as the template and copy modules
compute it, systemd's own view of a unit, pip's requirement specifiers), so a deleted unit file, a
stopped service or a changed config is reported and then repaired: nothing is taken on trust.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_state
short_description: Report in one call which packages, users, folders, files, services and URLs differ
description:
  - Compares the host with what a role wants and returns what is missing or different, so that the
    role runs its install and repair tasks only for that. Never changes the host; C(changed) is
    always false, also in check mode.
  - Packages are asked of dpkg (one C(dpkg-query)); units of systemd (one C(systemctl show));
    pip requirements of the environment's own interpreter (one call per environment); a layered
    PyTorch environment's base of its base interpreter (one call each).
  - A file differs when it is missing, is not a regular file, or its owner, group, mode, SHA-1 or
    required text differ; a folder when it is missing or its owner, group or mode differ.
version_added: "0.1.0"
author: forja contributors (@forja)
options:
  packages:
    description: Debian packages that must be installed.
    type: list
    elements: str
    default: []
  holds:
    description:
      - Debian packages that must be on hold when they are installed (those not installed are only
        reported as such).
    type: list
    elements: str
    default: []
  users:
    description: Users that must exist; C(home) and C(shell), when given, must match.
    type: list
    elements: dict
    default: []
  directories:
    description:
      - Folders that must exist, each C(path) with optional C(owner), C(group) and C(mode) (octal string).
    type: list
    elements: dict
    default: []
  files:
    description:
      - Regular files that must exist, each C(path) with optional C(owner), C(group), C(mode) (octal string),
        C(checksum) (SHA-1 of the whole content, as ansible's copy and template modules compute it) and
        C(contains) (text the file must hold).
    type: list
    elements: dict
    default: []
  exists:
    description: Paths whose presence is only reported (true or false), never counted as a difference.
    type: list
    elements: path
    default: []
  units:
    description:
      - systemd units, each C(name) with optional C(enabled) and C(active) (booleans). A unit that is
        not found, or whose file changed since systemd last read it, differs too.
    type: list
    elements: dict
    default: []
  pip:
    description:
      - Python environments, each C(python) (its interpreter), C(packages) (requirement specifiers that
        must be satisfied) and optional C(files) (entries as in I(files), with paths relative to the
        environment's site-packages folder, e.g. a patched module).
    type: list
    elements: dict
    default: []
  http:
    description:
      - URLs fetched from the host (GET, no proxy), each C(url) with C(status), the HTTP status codes
        that count as right.
    type: list
    elements: dict
    default: []
  torch_envs:
    description:
      - Environments layered on a base interpreter's PyTorch, each with the options of
        M(forja.gpu.forja_torch_env) (C(path), C(base_python), C(packages), C(pin), C(owner), ...).
      - Each is compared with its record as forja_torch_env compares it (the same inputs' hash, the
        base interpreter asked the same way), so the role calls that module only for one that is
        missing or out of date.
    type: list
    elements: dict
    default: []
notes:
  - Supports check mode; it is read-only either way.
"""

EXAMPLES = r"""
- name: Check the service's packages, files and unit in one call
  forja.gpu.host_state:
    packages: [python3-venv]
    directories:
      - {path: /etc/forja/jupyter, owner: root, group: jupyter, mode: "0750"}
    files:
      - path: /etc/systemd/system/forja-jupyter.service
        checksum: "{{ lookup('ansible.builtin.template', 'forja-jupyter.service.j2') | hash('sha1') }}"
        owner: root
        group: root
        mode: "0644"
    units:
      - {name: forja-jupyter.service, enabled: true, active: true}
    pip:
      - python: /opt/forja/jupyter/bin/python
        packages: [notebook==6.5.7]
  register: state

- name: Install what is missing
  ansible.builtin.apt:
    name: "{{ state.packages_missing }}"
  when: state.packages_missing | length > 0
"""

RETURN = r"""
ok:
  description: True when nothing differs (every list below is empty).
  returned: always
  type: bool
differences:
  description: One line per difference, for people (never file contents).
  returned: always
  type: list
  elements: str
packages_missing:
  description: The packages of I(packages) that are not installed.
  returned: always
  type: list
  elements: str
holds_installed:
  description: The packages of I(holds) that are installed.
  returned: always
  type: list
  elements: str
holds_missing:
  description: The installed packages of I(holds) that are not on hold.
  returned: always
  type: list
  elements: str
users_differ:
  description: The entries of I(users) that differ, each with C(reason).
  returned: always
  type: list
  elements: dict
directories_differ:
  description: The entries of I(directories) that differ, each with C(reason).
  returned: always
  type: list
  elements: dict
files_differ:
  description: The entries of I(files) that differ, each with C(reason).
  returned: always
  type: list
  elements: dict
exists:
  description: Each path of I(exists), true when it exists.
  returned: always
  type: dict
units_differ:
  description: The entries of I(units) that differ, each with C(reason).
  returned: always
  type: list
  elements: dict
pip:
  description: For each entry of I(pip), C(python), C(purelib) (null when the interpreter does not run),
    C(missing) (unsatisfied requirements) and C(files_differ).
  returned: always
  type: list
  elements: dict
http_differ:
  description: The entries of I(http) that answered another status, each with C(got) (null when unreachable).
  returned: always
  type: list
  elements: dict
torch_envs:
  description:
    - For each entry of I(torch_envs), C(path), C(action), what M(forja.gpu.forja_torch_env) would
      do - C(none), C(create), C(update) or C(rebuild), or C(check) when an input cannot be read (that
      module then fails with the same message) - and C(reason), why (empty for C(none)).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_host_state import (
    ARGUMENT_SPEC,
    HostStateError,
    compare,
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = compare(module.params, module.run_command)
    except HostStateError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
