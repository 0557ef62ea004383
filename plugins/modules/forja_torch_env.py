#!/usr/bin/python
# Copyright: forja contributors
# Apache-2.0
"""A Python environment layered on an interpreter's PyTorch, that can never replace that PyTorch.

Why a module: the Colab kernel (jupyter_colab) and a project's requirements (trainer_run) need the
same thing - their own writable environment that sees the image's multi-gigabyte PyTorch instead
of installing another one, and that refuses any install that would change it. Building it is
several steps (venv, layering, constraints, pip, a completion record) that must leave nothing
half-made when pip fails; one module is that one home, and both roles call it.

Layering: the environment is a plain venv of the base interpreter's own Python, plus a ``.pth``
file listing the base's site-packages folders, so it sees what the base sees (also when the base
is itself a venv, which ``--system-site-packages`` cannot chain) after its own packages. A
constraints file pins the base's torch (and any other ``pin``) to the installed version: every pip
run here is given it, and a kernel gets it as ``PIP_CONSTRAINT``, so ``%pip install`` fails rather
than replace torch.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: forja_torch_env
short_description: A Python environment layered on a base interpreter's PyTorch, which it never replaces
description:
  - Creates (or updates) a venv at I(path) from the base interpreter's Python, makes it see the
    base's site-packages (a C(.pth) file, after its own), writes C(forja-constraints.txt) pinning
    the base's installed versions of I(pin), upgrades pip to I(pip_package) and installs
    I(packages) and I(requirements) under those constraints.
  - Idempotent - a record (C(.forja-env.json)) of the inputs' hash marks a finished environment;
    the same inputs change nothing.
  - Nothing half-made - a new environment that fails to build is removed again and the task
    fails with pip's own message. With I(mutable) (a notebook kernel's environment, which users
    add packages to), an existing environment is updated in place instead of rebuilt.
version_added: "0.1.0"
author: forja contributors (@forja)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
options:
  base_python:
    description: The interpreter whose packages (its PyTorch) the environment layers on.
    type: path
    required: true
  path:
    description: The environment's folder (absolute).
    type: path
    required: true
  packages:
    description: Requirement specifiers to install.
    type: list
    elements: str
    default: []
  requirements:
    description: A requirements file on the host to install (C(pip install -r)).
    type: path
  pin:
    description:
      - Distributions of the base whose installed versions are pinned in C(forja-constraints.txt).
      - A name the base does not have is skipped.
    type: list
    elements: str
    default: [torch]
  pip_package:
    description: The pip installed into the environment first (e.g. C(pip==25.3)); empty keeps venv's own.
    type: str
    default: ""
  pip_args:
    description: Extra pip arguments for every install (e.g. C(--find-links /srv/wheels)).
    type: str
    default: ""
  owner:
    description: User that owns the environment (e.g. the notebook user, so its C(%pip) can write it).
    type: str
  mutable:
    description:
      - Update an existing environment in place when the inputs change, instead of rebuilding it
        (keeps what users installed into it). A new or unfinished one is still built from scratch.
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
- name: Find the image's PyTorch
  forja.gpu.torch_python_facts:
  register: found_torch

- name: A kernel environment on it, owned by the notebook user
  forja.gpu.forja_torch_env:
    base_python: "{{ found_torch.python }}"
    path: /home/jupyter/kernels/python3
    packages: [ipykernel==6.29.5]
    owner: jupyter
    mutable: true

- name: A project's requirements, in an environment named by their hash
  forja.gpu.forja_torch_env:
    base_python: /opt/forja/trainer-venv/bin/python
    path: "/opt/forja/envs/{{ requirements_hash }}"
    requirements: "/opt/forja/envs/{{ requirements_hash }}.requirements.txt"
"""

RETURN = r"""
python:
  description: The environment's interpreter.
  returned: always
  type: str
  sample: /home/jupyter/kernels/python3/bin/python
constraints_file:
  description: The constraints file pinning the base's versions (for pip's C(-c) or C(PIP_CONSTRAINT)).
  returned: always
  type: str
pins:
  description: What was pinned, name to version.
  returned: always
  type: dict
  sample: {"torch": "2.7.1"}
inputs_hash:
  description: SHA-256 of everything the environment was built from.
  returned: always
  type: str
action:
  description: C(none) (already as asked), C(created), C(updated) or C(rebuilt).
  returned: always
  type: str
"""

import json
import os
import pwd
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.forja.gpu.plugins.module_utils.forja_torch_layer import (
    ARGUMENT_SPEC,
    CONSTRAINTS,
    LAYER_PTH,
    RECORD,
    TorchLayerError,
    constraints_text,
    inputs_hash,
    layer_pth_text,
    pip_tail,
    plan,
    probe_base,
    read_record,
    read_requirements,
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    path = p["path"]
    if not os.path.isabs(path):
        module.fail_json(msg=f"path: {path!r} must be an absolute folder")
    owner = None
    if p["owner"]:
        try:
            owner = pwd.getpwnam(p["owner"])
        except KeyError:
            module.fail_json(msg=f"owner: no user {p['owner']!r} on the host")
    try:
        requirements_text = read_requirements(p["requirements"])
        base = probe_base(module.run_command, p["base_python"], p["pin"])
    except TorchLayerError as exc:
        module.fail_json(msg=str(exc))
    wanted = inputs_hash(base, p, requirements_text)
    python = os.path.join(path, "bin", "python")
    result = {"changed": False, "python": python, "constraints_file": os.path.join(path, CONSTRAINTS),
              "pins": base["pins"], "inputs_hash": wanted}
    action = plan(read_record(path), wanted, p["mutable"])
    result["action"] = action
    if action == "none" or module.check_mode:
        result["changed"] = action != "none"
        module.exit_json(**result)

    fresh = action in ("create", "rebuild")

    def run(argv: list[str], what: str) -> None:
        # Huge wheels (torch, nvidia-*) can arrive cut short: pip >= 25.1 resumes them (older pips,
        # such as the one a new venv starts with, ignore the variable).
        env = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore", "PIP_NO_INPUT": "1",
               "PIP_RESUME_RETRIES": "10"}
        code, o, e = module.run_command(argv, environ_update=env)
        if code != 0:
            if fresh:
                shutil.rmtree(path, ignore_errors=True)
            left = ("removed it again: nothing is left half-installed" if fresh
                    else "the existing environment is as pip left it")
            module.fail_json(msg=f"{what} failed in {path} ({left}):\n{pip_tail(o, e)}", **result)

    if fresh:
        shutil.rmtree(path, ignore_errors=True)
        run([base["base_executable"], "-m", "venv", path], "creating the venv")
    purelib_cmd = [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
    code, purelib, e = module.run_command(purelib_cmd)
    if code != 0:
        if fresh:
            shutil.rmtree(path, ignore_errors=True)
        module.fail_json(msg=f"the new venv's Python does not run: {e.strip()}", **result)
    with open(os.path.join(purelib.strip(), LAYER_PTH), "w") as fh:
        fh.write(layer_pth_text(base["site_dirs"]))
    with open(result["constraints_file"], "w") as fh:
        fh.write(constraints_text(base["pins"]))
    pip = [python, "-m", "pip", "install", "--progress-bar", "off", "-c", result["constraints_file"]]
    pip += p["pip_args"].split() if p["pip_args"] else []
    if p["pip_package"]:
        run([*pip, p["pip_package"]], f"installing {p['pip_package']}")
    wants = list(p["packages"]) + (["-r", p["requirements"]] if p["requirements"] else [])
    if wants:
        run(pip + wants, "pip install " + " ".join(wants))
    with open(os.path.join(path, RECORD), "w") as fh:
        json.dump({"inputs_hash": wanted, "base_python": p["base_python"], "pins": base["pins"]}, fh,
                  indent=1)
    if owner:
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), owner.pw_uid, owner.pw_gid)
        os.lchown(path, owner.pw_uid, owner.pw_gid)
    result["changed"] = True
    module.exit_json(**result)


if __name__ == "__main__":
    main()
