# Copyright: forja contributors
# Apache-2.0
"""A figure for people in a playbook's message, as the ``forja`` command prints it.

The rules (a loss to 4 significant digits, money in cents or fractions of a cent, durations in two
units, which kind each summary field is) live in plugin_utils/forja_format.py, which ``forja.format``
reads too (loading that file by path); this plugin only hands a value to it, so what a playbook
prints and what ``forja`` prints never differ. It imports nothing of forja: the installed collection
works alone. Documentation: ``forja_format.yml`` beside this file
(``ansible-doc -t filter forja.gpu.forja_format``).
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.forja.gpu.plugins.plugin_utils.forja_format import SUMMARY_FORMATS, field


def forja_format(value: Any, what: str) -> str:
    """`value` shown as `what` (a summary field such as final_loss, or a kind such as money)."""
    if what not in SUMMARY_FORMATS:
        known = ", ".join(sorted(SUMMARY_FORMATS))
        raise AnsibleFilterError(f"forja_format: {what!r} is not a figure forja knows; use one of {known}")
    return field(what, value)


class FilterModule:
    """forja's figures for people."""

    def filters(self) -> dict[str, Any]:
        return {"forja_format": forja_format}
