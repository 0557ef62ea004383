"""Peak throughput of the accelerators this project meets, for MFU and the benchmark's "% of peak".

Dense (no sparsity) tensor-core numbers from the vendors' datasheets; the L4's 121 TFLOPS bf16 is
the reference the project measures against. Unknown devices report no fraction rather than a guess.
"""

from __future__ import annotations

# name fragment (as torch.cuda.get_device_name shows it) -> {precision: FLOP/s}
PEAK_FLOPS: dict[str, dict[str, float]] = {
    "L4": {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "tf32": 494e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "T4": {"fp16": 65e12, "fp32": 8.1e12},
    "V100": {"fp16": 125e12, "fp32": 15.7e12},
}
L4_BF16_PEAK = PEAK_FLOPS["L4"]["bf16"]


def peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s for ``precision`` on the named device, or None if the device is not in the table."""
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in device_name.split() or f" {fragment}" in device_name:
            return peaks.get(precision)
    return None
