# Copyright: forja contributors
# Apache-2.0
"""Inventory plugin that lists no hosts: it stops a command that was given no inventory."""

from __future__ import annotations

DOCUMENTATION = r"""
name: inventory_required
short_description: Stop any command that was not told which inventory to use
description:
  - The default inventory of a clone of forja (C(ansible.cfg)). It adds no hosts; parsing it
    fails with a message that lists the inventories to choose from, so a command run without
    C(-i) stops before it touches anything, instead of acting on a cloud nobody chose.
  - An explicit C(-i), or C(ANSIBLE_INVENTORY), replaces this source, so it is never read then.
  - A syntax check (C(ansible-playbook --syntax-check), which ansible-lint runs) reaches no host, so
    no cloud is chosen; it gets an empty inventory instead of the error.
options:
  plugin:
    description: Marks this file as the inventory_required plugin's.
    required: true
    choices: ['inventory_required', 'forja.gpu.inventory_required']
  choices:
    description:
      - The inventories to choose from, each path (relative to the clone) with what it is.
      - Listed in the error, one C(-i PATH) per line, in this order.
    type: dict
    required: true
  hint:
    description: A last line for the error, e.g. how other tools name the inventory.
    type: str
    default: ''
"""

EXAMPLES = r"""
# inventory/choose.yml, named by ansible.cfg's [defaults] inventory
plugin: forja.gpu.inventory_required
choices:
  inventory/gcp_gpu.yml: your Google Cloud project
---
# With a hint for a wrapper's own option
plugin: forja.gpu.inventory_required
choices:
  inventory/gcp_gpu.yml: your Google Cloud project
  inventory/staging.yml: the staging project
hint: "The forja CLI takes the same -i, or the FORJA_INVENTORY environment variable."
"""

RETURN = r""" # """

import re

from ansible import context
from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin


def message(choices: dict[str, str], hint: str = "") -> str:
    """The error a command without an inventory stops with: one `-i PATH  what` line per choice."""
    width = max((len(path) for path in choices), default=0)
    lines = ["No inventory chosen: name one with -i, e.g.", ""]
    lines += [f"  ansible-playbook -i {path:<{width}}  site.yml    # {what}"
              for path, what in choices.items()]
    if hint:
        lines += ["", hint]
    return "\n".join(lines)


class InventoryModule(BaseInventoryPlugin):
    NAME = "forja.gpu.inventory_required"

    def verify_file(self, path: str) -> bool:
        """Only a YAML file that names this plugin: never claim another plugin's config."""
        if not (super().verify_file(path) and path.endswith((".yml", ".yaml"))):
            return False
        with open(path, encoding="utf-8") as config:
            text = config.read()
        return re.search(r"^plugin:\s*['\"]?(forja\.gpu\.)?inventory_required\b", text, re.M) is not None

    def parse(self, inventory, loader, path, cache=True):  # type: ignore[no-untyped-def]
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        if context.CLIARGS.get("syntax"):
            return
        raise AnsibleParserError(message(dict(self.get_option("choices")), self.get_option("hint")))
