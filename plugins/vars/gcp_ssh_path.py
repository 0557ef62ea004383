# Copyright: forja contributors
# Apache-2.0
"""The SSH path of the gcp_instance role's defaults, for every host.

The gcp_instance role keeps the firewall rule of the path Ansible uses to reach its VMs
(gcp_instance_ssh_mode and the user, key and IAP command that go with it); the hosts' connection
settings (inventory/group_vars/all/access.yml) need the same values. A host's play cannot see a
role's defaults, and restating them in group_vars would give them a second home that hides a change
to the role. So this plugin reads them from the role's defaults/main.yml, the one statement, and
gives them to the group "all" as one dict, `forja_ssh_path_defaults`. Not as the variables
themselves: ansible-core runs builtin vars plugins (group_vars files) before a collection's, so the
plugin's values would override the user's group_vars; access.yml takes a variable when it is set
(group_vars, -e) and the role's default otherwise, exactly as the role does.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gcp_ssh_path
short_description: Give every host the gcp_instance role's SSH path defaults, as one dict
version_added: "0.2.0"
author: forja contributors (@forja)
description:
  - Returns the C(gcp_instance_ssh_*) variables of the C(forja.gpu.gcp_instance) role's defaults
    (C(roles/gcp_instance/defaults/main.yml)) as the dict C(forja_ssh_path_defaults) of the group C(all).
  - Hosts then build their connection (C(ansible_ssh_common_args) with an IAP ProxyCommand, the key,
    the user) from the same values the role uses for the firewall rule and the ssh-keys metadata,
    e.g. C({{ gcp_instance_ssh_mode | default(forja_ssh_path_defaults.gcp_instance_ssh_mode) }}).
  - Enable it in C(vars_plugins_enabled), as forja's C(ansible.cfg) does. It runs when the inventory
    is loaded (stage C(inventory)), not again for every task, since the role's defaults do not change
    during a run, and a vars plugin asked on demand costs every task of a play.
extends_documentation_fragment:
  - ansible.builtin.vars_plugin_staging
options:
  stage:
    default: inventory
"""

EXAMPLES = r"""
# ansible.cfg
# [defaults]
# vars_plugins_enabled = forja.gpu.gcp_ssh_path, ansible.builtin.host_group_vars
#
# group_vars/all/access.yml: the role's value when set, else its default
ansible_user: "{{ gcp_instance_ssh_user | default(forja_ssh_path_defaults.gcp_instance_ssh_user) }}"
"""

import functools
from pathlib import Path
from typing import Any

import yaml
from ansible.inventory.group import Group
from ansible.plugins.vars import BaseVarsPlugin

#: Which of the role's defaults the hosts need: the SSH path, nothing else of the VM.
PREFIX = "gcp_instance_ssh_"
DEFAULTS = Path(__file__).resolve().parents[2] / "roles" / "gcp_instance" / "defaults" / "main.yml"


def ssh_path_defaults(defaults_file: Path = DEFAULTS) -> dict[str, Any]:
    """The role's `gcp_instance_ssh_*` defaults (parsed once per version of the file)."""
    stat = defaults_file.stat()
    return dict(_parsed(defaults_file, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4)
def _parsed(defaults_file: Path, _mtime_ns: int, _size: int) -> dict[str, Any]:
    """Ansible asks vars plugins on every task (stage "demand"): parse the YAML only when it changed."""
    values = yaml.safe_load(defaults_file.read_text()) or {}
    return {name: value for name, value in values.items() if name.startswith(PREFIX)}


class VarsModule(BaseVarsPlugin):
    """Hands the role's SSH path defaults to the group "all"."""

    def get_vars(self, loader: Any, path: str, entities: Any, cache: bool = True) -> dict[str, Any]:
        super().get_vars(loader, path, entities)
        entities = entities if isinstance(entities, list) else [entities]
        if any(isinstance(e, Group) and e.name == "all" for e in entities):
            return {"forja_ssh_path_defaults": ssh_path_defaults()}
        return {}
