# Copyright: forja contributors
# Apache-2.0
"""One call of a controller-side forja module, whoever runs it: AnsibleModule or Ansible's own process.

Why here: the GCP modules only talk to Google's APIs from the controller. Run as modules, each task
ships and starts a module (an AnsiballZ build and a fresh Python: about a second of every re-run on
the 2-core test machine); their action plugins run the same `run(call)` inside Ansible's process
instead (plugin_utils/forja_in_process.py). A module's logic sees only this object, so both paths
run the same code: `main()` wraps an AnsibleModule in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ModuleFailure(Exception):
    """The call fails with `msg` and the result keys in `result` (fail_json's arguments)."""

    def __init__(self, msg: str, **result: Any) -> None:
        super().__init__(msg)
        self.msg = msg
        self.result = result


@dataclass
class Call:
    """The validated options and the run's modes, and the warnings the call gives."""

    params: dict[str, Any]
    check_mode: bool = False
    diff: bool = False
    warnings: list[str] = field(default_factory=list)

    def warn(self, msg: str) -> None:
        self.warnings.append(msg)

    def with_diff(self, result: dict[str, Any], before: dict[str, Any], after: dict[str, Any],
                  **headers: str) -> dict[str, Any]:
        """`result`, with its `diff` (before, after and any headers) when the run asked for one (--diff)."""
        if self.diff:
            result["diff"] = {"before": before, "after": after, **headers}
        return result


def run_as_module(spec: dict[str, Any], run: Any) -> None:
    """A module's main(): validate with AnsibleModule, run `run(call)`, exit or fail as it says."""
    from ansible.module_utils.basic import AnsibleModule  # only the module path needs it

    module = AnsibleModule(supports_check_mode=True, **spec)
    call = Call(module.params, module.check_mode, module._diff)
    try:
        result = run(call)
    except ModuleFailure as exc:
        for msg in call.warnings:
            module.warn(msg)
        module.fail_json(msg=exc.msg, **exc.result)
    for msg in call.warnings:
        module.warn(msg)
    module.exit_json(**result)
