# Copyright: forja contributors
# Apache-2.0
"""Which NVIDIA GPUs a host has: the PCI bus (before any driver) and nvidia-smi (with one).

Why here: nvidia_facts reports them with the rest of the stack, and torch_python_facts (its `gpus`
option) with the interpreter that will use them, so a role that needs both asks the host once; one
copy of the reading keeps both answers equal.
"""

from __future__ import annotations

import csv
import glob
import io
import os
import xml.etree.ElementTree as ET

SMI_FIELDS = ("index", "name", "driver_version", "persistence_mode", "memory.total", "pci.bus_id", "uuid")
NVIDIA_VENDOR = "0x10de"
# PCI class 0x03xxxx = display controller (VGA 0x0300, 3D 0x0302); datacenter GPUs report 0x0302.
DISPLAY_CLASS_PREFIX = "0x03"


def parse_smi_csv(text: str, fields: tuple[str, ...] = SMI_FIELDS) -> list[dict]:
    """Rows of `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits` as dicts.

    Keys use underscores; numbers become ints; "[N/A]" and "[Not Supported]" become None so
    callers never compare against a placeholder string.
    """
    rows = []
    for values in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not values or not "".join(values).strip():
            continue
        if len(values) != len(fields):
            raise ValueError(f"expected {len(fields)} CSV fields ({','.join(fields)}), "
                             f"got {len(values)}: {values}")
        row: dict = {}
        for field, raw in zip(fields, values, strict=True):
            value = raw.strip()
            key = field.replace(".", "_")
            if value.startswith("[") and value.endswith("]"):
                row[key] = None
            elif value.isdigit():
                row[key] = int(value)
            else:
                row[key] = value
        if "memory_total" in row:
            row["memory_total_mib"] = row.pop("memory_total")
        rows.append(row)
    return rows


def parse_smi_xml(text: str) -> dict:
    """Driver and CUDA versions from `nvidia-smi -q -x` (the CSV query has no CUDA field)."""
    root = ET.fromstring(text)
    return {
        "driver_version": (root.findtext("driver_version") or "").strip() or None,
        "cuda_version": (root.findtext("cuda_version") or "").strip() or None,
    }


def pci_gpus(sysfs: str = "/sys") -> list[dict]:
    """NVIDIA display controllers on the PCI bus, read from sysfs (works before any driver is installed)."""
    gpus = []
    for dev in sorted(glob.glob(os.path.join(sysfs, "bus/pci/devices/*"))):
        try:
            with open(os.path.join(dev, "vendor")) as fh:
                vendor = fh.read().strip()
            with open(os.path.join(dev, "class")) as fh:
                klass = fh.read().strip()
            with open(os.path.join(dev, "device")) as fh:
                device = fh.read().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass.startswith(DISPLAY_CLASS_PREFIX):
            gpus.append({"address": os.path.basename(dev), "device_id": device, "class": klass})
    return gpus


def run_smi(module, smi_name: str) -> dict:  # type: ignore[no-untyped-def]
    """nvidia-smi's GPUs, driver and CUDA version; `ok` false with the `error` when it cannot answer."""
    smi = {"path": None, "ok": False, "rc": None, "error": "", "gpus": [], "driver_version": None,
           "cuda_version": None}
    path = smi_name if os.path.isabs(smi_name) else module.get_bin_path(smi_name)
    if not path or not os.path.exists(path):
        smi["error"] = f"{smi_name} not found"
        return smi
    smi["path"] = path
    rc, out, err = module.run_command([path, "--query-gpu=" + ",".join(SMI_FIELDS),
                                       "--format=csv,noheader,nounits"])
    smi["rc"] = rc
    if rc != 0:
        smi["error"] = (err or out).strip()
        return smi
    try:
        smi["gpus"] = parse_smi_csv(out)
    except ValueError as exc:
        smi["error"] = str(exc)
        return smi
    rc, out, err = module.run_command([path, "-q", "-x"])
    if rc == 0:
        try:
            smi.update(parse_smi_xml(out))
        except ET.ParseError as exc:
            smi["error"] = f"nvidia-smi -q -x: {exc}"
    if not smi["driver_version"] and smi["gpus"]:
        smi["driver_version"] = smi["gpus"][0].get("driver_version")
    smi["ok"] = True
    return smi
