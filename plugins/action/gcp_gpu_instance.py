# Copyright: forja contributors
# Apache-2.0
"""Action plugin gcp_gpu_instance: the module's run() inside Ansible's process on the controller."""

from __future__ import annotations

from ansible_collections.forja.gpu.plugins.modules import gcp_gpu_instance
from ansible_collections.forja.gpu.plugins.plugin_utils.forja_in_process import InProcessModuleAction


class ActionModule(InProcessModuleAction):
    """See plugin_utils/forja_in_process.py."""

    MODULE = gcp_gpu_instance
