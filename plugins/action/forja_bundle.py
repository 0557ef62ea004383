# Copyright: forja contributors
# Apache-2.0
"""Action plugin forja_bundle: pack controller folders inside Ansible's own process.

Why an action plugin: the folders are on the controller and the archive is written there, so shipping
a module to run it (an AnsiballZ build and a fresh Python) only added about a second to every run,
re-runs included. The module file of the same name documents the options; the work is
forja_bundle.bundle() in module_utils.
"""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.forja.gpu.plugins.module_utils.forja_bundle import ARGUMENT_SPEC, BundleError, bundle


class ActionModule(ActionBase):
    """Runs forja_bundle on the controller, whatever host the task names."""

    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        _validation, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            result.update(bundle(params, bool(self._task.check_mode)))
        except BundleError as exc:
            result.update(failed=True, msg=str(exc), changed=False)
        return result
