# Copyright: forja contributors
# Apache-2.0
"""Mitogen's `linear` strategy as forja.gpu.mitogen_linear, for re-runs about twice as fast.

forja re-exports the strategy that the pinned `mitogen` package installs in the virtualenv, so
that it is named by the collection's FQCN, with no path into the venv in ansible.cfg.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: mitogen_linear
short_description: Ansible's linear strategy over Mitogen connections, opt-in, for faster runs
description:
  - Runs tasks in lockstep like C(ansible.builtin.linear), but through Mitogen, which keeps one
    Python interpreter per host alive for the whole play and sends each module's code once.
  - On forja's sandbox an idempotent C(site.yml) re-run takes about half as long as with
    C(ansible.builtin.linear) (C(bench/sandbox_bench.py) measures both).
  - forja re-exports the strategy that the pinned C(mitogen) package installs, so it is named
    C(forja.gpu.mitogen_linear) like the rest of the collection, with no path into the virtualenv.
notes:
  - Opt-in, not forja's default; ansible-core 2.19 warns that strategy plugins outside
    C(ansible.builtin) are deprecated.
  - For re-runs only. On a first converge, the jupyter_colab role's kernel builds (started with
    C(async) and C(poll=0)) never finished under it, and the play waited on them.
  - Mitogen builds its own ssh command line; host-key checking follows C(ansible_host_key_checking)
    (the sandbox sets it to false, as it turns it off for the ssh plugin).
author:
  - forja contributors (@forja)
"""

EXAMPLES = r"""
# An idempotent re-run of the whole job through Mitogen (not a first converge: see the notes):
#   ANSIBLE_STRATEGY=forja.gpu.mitogen_linear ansible-playbook site.yml
# Or for one play:
- name: Configure the GPU hosts through Mitogen
  hosts: forja_gpu
  strategy: forja.gpu.mitogen_linear
  roles:
    - role: forja.gpu.jupyter_colab
"""

from typing import Any

try:
    from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule
except ImportError as exc:  # mitogen is forja's dependency, not the collection's: say so when asked for
    MITOGEN_IMPORT_ERROR: ImportError | None = exc

    from ansible.errors import AnsibleError
    from ansible.plugins.strategy.linear import StrategyModule as _Linear

    class StrategyModule(_Linear):  # type: ignore[no-redef]
        """Stands in when mitogen is missing, so that choosing the strategy fails with the fix."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise AnsibleError(
                "forja.gpu.mitogen_linear needs the mitogen package in Ansible's Python "
                f"({MITOGEN_IMPORT_ERROR}); pip install the mitogen that forja's pyproject.toml pins, "
                "or unset ANSIBLE_STRATEGY / the play's strategy"
            )
else:
    MITOGEN_IMPORT_ERROR = None

__all__ = ["StrategyModule"]
