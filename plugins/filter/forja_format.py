# Copyright: forja contributors
# Apache-2.0
"""A figure for people in a playbook's message, as the ``forja`` command prints it (``forja.format``).

The rules (a loss to 4 significant digits, money in cents or fractions of a cent, durations in two
units) live in ``forja.format``; this plugin only hands a value to it, so what a playbook prints and
what ``forja`` prints never differ. Documentation: ``forja_format.yml`` beside this file
(``ansible-doc -t filter forja.gpu.forja_format``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

_IMPORT_ERROR: ImportError | None = None
try:
    from forja.format import SUMMARY_FORMATS, field
except ImportError:  # Ansible run by a Python without forja installed: use the checkout it lives in
    _REPO = Path(__file__).resolve().parents[2]
    if (_REPO / "forja" / "format.py").is_file() and str(_REPO) not in sys.path:
        sys.path.append(str(_REPO))
    try:
        from forja.format import SUMMARY_FORMATS, field
    except ImportError as exc:  # reported when the filter is used, so ansible-doc still renders
        _IMPORT_ERROR = exc


def forja_format(value: Any, what: str) -> str:
    """`value` shown as `what` (a summary field such as final_loss, or a kind such as money)."""
    if _IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            f"forja_format: forja cannot be imported ({_IMPORT_ERROR}); "
            "run Ansible from forja's virtualenv (source .venv/bin/activate)"
        )
    if what not in SUMMARY_FORMATS:
        known = ", ".join(sorted(SUMMARY_FORMATS))
        raise AnsibleFilterError(f"forja_format: {what!r} is not a figure forja knows; use one of {known}")
    return field(what, value)


class FilterModule:
    """forja's figures for people."""

    def filters(self) -> dict[str, Any]:
        return {"forja_format": forja_format}
