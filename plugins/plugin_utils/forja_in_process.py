# Copyright: forja contributors
# Apache-2.0
"""The action plugin of a controller-side forja module: run its logic inside Ansible's process.

Why: forja's GCP modules only call Google's APIs, from the controller. Shipping one as a module costs
each task an AnsiballZ build and a fresh Python that imports google-auth again (the inventory plugin
has it imported already in Ansible's process); in-process, a re-run that changes nothing skips that.
The module's own `run(call)` does the work either way (module_utils/forja_call.py), so the result is
the same. A task that Ansible would run elsewhere (another host's connection, become, an
`environment`) runs the module as usual.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.forja.gpu.plugins.module_utils.forja_call import Call, ModuleFailure


class InProcessModuleAction(ActionBase):
    """Subclasses set MODULE: the module's Python module, with SPEC (AnsibleModule's arguments) and run."""

    MODULE: ModuleType
    _supports_check_mode = True
    _supports_async = False

    def _in_process(self) -> bool:
        """Only where the module would run on the controller, as the controller's user, unchanged."""
        environment = [entry for entry in self._task.environment or [] if entry]  # Ansible keeps [{}]
        return self._connection.transport == "local" and not self._play_context.become and not environment

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        if not self._in_process():
            result.update(self._execute_module(module_name=self._task.resolved_action, task_vars=task_vars))
            return result
        spec = self.MODULE.SPEC
        _validation, params = self.validate_argument_spec(
            argument_spec=spec["argument_spec"],
            **{key: value for key, value in spec.items() if key != "argument_spec"})
        call = Call(params, bool(self._task.check_mode), bool(self._task.diff))
        try:
            result.update(self.MODULE.run(call))
        except ModuleFailure as exc:
            result.update(exc.result, failed=True, msg=exc.msg)
            result.setdefault("changed", False)
        if call.warnings:
            result["warnings"] = result.get("warnings", []) + call.warnings
        return result
