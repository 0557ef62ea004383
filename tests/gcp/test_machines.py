"""Which GPUs a machine type carries or accepts: decided before any API call."""

from __future__ import annotations

import pytest
from ansible_collections.forja.gpu.plugins.module_utils.forja_gcp_machines import (
    GpuSpec,
    MachineSpecError,
    resolve_gpus,
)


@pytest.mark.parametrize(
    ("machine_type", "gpu_type", "gpu_count", "expected"),
    [
        ("g2-standard-8", None, None, GpuSpec("nvidia-l4", 1, attach=False)),
        ("g2-standard-8", "nvidia-l4", 1, GpuSpec("nvidia-l4", 1, attach=False)),
        ("g2-standard-24", None, 2, GpuSpec("nvidia-l4", 2, attach=False)),
        ("g2-standard-96", "nvidia-l4", None, GpuSpec("nvidia-l4", 8, attach=False)),
        ("a2-highgpu-4g", None, None, GpuSpec("nvidia-tesla-a100", 4, attach=False)),
        ("a2-ultragpu-1g", None, None, GpuSpec("nvidia-a100-80gb", 1, attach=False)),
        ("a3-highgpu-8g", "nvidia-h100-80gb", 8, GpuSpec("nvidia-h100-80gb", 8, attach=False)),
        ("n1-standard-8", "nvidia-tesla-t4", None, GpuSpec("nvidia-tesla-t4", 1, attach=True)),
        ("n1-standard-8", "nvidia-tesla-v100", 8, GpuSpec("nvidia-tesla-v100", 8, attach=True)),
        ("e2-standard-4", None, None, GpuSpec(None, 0, attach=False)),
    ],
)
def test_valid_combinations_say_what_the_vm_will_carry(machine_type, gpu_type, gpu_count, expected):
    assert resolve_gpus(machine_type, gpu_type, gpu_count) == expected


@pytest.mark.parametrize(
    ("machine_type", "gpu_type", "gpu_count", "field", "fix"),
    [
        ("e2-standard-8", "nvidia-l4", 1, "gpu_type:", "g2-standard-8"),
        ("n1-standard-8", "nvidia-l4", 1, "gpu_type:", "G2"),
        ("g2-standard-8", "nvidia-tesla-t4", None, "gpu_type:", "drop gpu_type"),
        ("g2-standard-8", None, 2, "gpu_count:", "set gpu_count to 1"),
        ("a2-highgpu-1g", None, 8, "gpu_count:", "exactly 1"),
        ("g2-standard-7", None, None, "machine_type:", "g2-standard-8"),
        ("n1-standard-8", "nvidia-tesla-t4", 3, "gpu_count:", "1, 2, 4"),
        ("n1-standard-8", "nvidia-tesla-k80", 1, "gpu_type:", "nvidia-tesla-t4"),
        ("e2-standard-8", "nvidia-tesla-t4", 1, "gpu_type:", "N1"),
        ("e2-standard-8", None, 2, "gpu_count:", "gpu_type"),
        ("G2 standard", None, None, "machine_type:", "g2-standard-8"),
    ],
)
def test_impossible_combinations_name_the_field_and_the_fix(machine_type, gpu_type, gpu_count, field, fix):
    with pytest.raises(MachineSpecError) as caught:
        resolve_gpus(machine_type, gpu_type, gpu_count)
    assert str(caught.value).startswith(field)
    assert fix in str(caught.value)
