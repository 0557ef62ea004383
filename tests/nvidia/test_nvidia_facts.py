"""The nvidia_facts module's parsers (its GPU reading in module_utils/forja_nvidia.py), fed with real
output of nvidia-smi, /proc, dpkg and apt.

Samples: the nvidia-smi values are those of a real g2 host's L4 (driver 570.133.20, CUDA 12.8,
23034 MiB, persistence on, as printed in a public nvidia-smi report); the /proc lines are the
two real formats (proprietary and open kernel module); the dpkg and apt samples were captured
on the nvidia_stack test host against the stand-in repository.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from ansible_collections.forja.gpu.plugins.module_utils import forja_nvidia

MODULE_PATH = Path(__file__).resolve().parents[2] / "plugins" / "modules" / "nvidia_facts.py"
spec = importlib.util.spec_from_file_location("nvidia_facts", MODULE_PATH)
assert spec and spec.loader
nvidia_facts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(nvidia_facts)

L4_UUID = "GPU-2f9e8c51-4b1a-6d3e-8f07-c1d2e3a4b5c6"
L4_CSV = f"0, NVIDIA L4, 570.133.20, Enabled, 23034, 00000000:31:00.0, {L4_UUID}\n"
TWO_L4_CSV = (
    "0, NVIDIA L4, 570.172.08, Enabled, 23034, 00000000:00:03.0, GPU-a\n"
    "1, NVIDIA L4, 570.172.08, Disabled, 23034, 00000000:00:04.0, GPU-b\n"
)
NOT_SUPPORTED_CSV = "0, NVIDIA L4, 570.133.20, [N/A], [Not Supported], 00000000:31:00.0, GPU-x\n"

SMI_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
\t<timestamp>Mon Apr 14 12:55:43 2025</timestamp>
\t<driver_version>570.133.20</driver_version>
\t<cuda_version>12.8</cuda_version>
\t<attached_gpus>1</attached_gpus>
\t<gpu id="00000000:31:00.0">
\t\t<product_name>NVIDIA L4</product_name>
\t\t<persistence_mode>Enabled</persistence_mode>
\t</gpu>
</nvidia_smi_log>
"""

PROC_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03  Thu Apr  3 01:14:19 UTC 2025\n")
PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
    "(dvs-builder@U16-A24-23-2)  Tue Mar  5 22:15:33 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04) \n"
)
PROC_TWO_PART = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.84  Release Build\n"

# `apt-get -s dist-upgrade` on the test host with the preferences ignored (captured).
APT_SIMULATION = """NOTE: This is only a simulation!
      apt-get needs root privileges for real execution.
Reading package lists...
Building dependency tree...
Reading state information...
Calculating upgrade...
The following NEW packages will be installed:
  cuda-toolkit-12-9 nvidia-driver-580
The following packages will be upgraded:
  cuda-toolkit nvidia-driver-570
2 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.
Inst cuda-toolkit-12-9 (12.9.1-1 NVIDIA:/ [amd64])
Inst cuda-toolkit [12.8.1-1] (12.9.1-1 NVIDIA:/ [amd64])
Inst nvidia-driver-580 (580.95.05-0ubuntu1 NVIDIA:/ [amd64])
Inst nvidia-driver-570 [570.172.08-0ubuntu1] (580.95.05-0ubuntu1 NVIDIA:/ [amd64])
Conf cuda-toolkit-12-9 (12.9.1-1 NVIDIA:/ [amd64])
Conf cuda-toolkit (12.9.1-1 NVIDIA:/ [amd64])
Remv libnvidia-compute-570 [570.172.08-0ubuntu1]
"""

DPKG_LIST = (
    "cuda-drivers-570\t570.172.08-1\tii \n"
    "linux-gcp\t5.15.0.9080.1\thi \n"
    "nvidia-driver-570\t570.172.08-0ubuntu1\tii \n"
    "nvidia-driver-575\t575.64.05-0ubuntu1\trc \n"
    "openssh-server\t1:8.9p1-3ubuntu0.13\tii \n"
)


class TestNvidiaSmiCsv:
    def test_one_l4_becomes_one_typed_row(self):
        assert forja_nvidia.parse_smi_csv(L4_CSV) == [{
            "index": 0, "name": "NVIDIA L4", "driver_version": "570.133.20", "persistence_mode": "Enabled",
            "memory_total_mib": 23034, "pci_bus_id": "00000000:31:00.0",
            "uuid": L4_UUID,
        }]

    def test_each_gpu_is_one_row_in_order(self):
        rows = forja_nvidia.parse_smi_csv(TWO_L4_CSV)
        assert [r["index"] for r in rows] == [0, 1]
        assert [r["persistence_mode"] for r in rows] == ["Enabled", "Disabled"]

    def test_placeholders_become_none_not_strings(self):
        row = forja_nvidia.parse_smi_csv(NOT_SUPPORTED_CSV)[0]
        assert row["persistence_mode"] is None and row["memory_total_mib"] is None

    def test_empty_output_means_no_gpu(self):
        assert forja_nvidia.parse_smi_csv("\n") == []

    def test_a_row_of_the_wrong_width_is_an_error_naming_the_fields(self):
        with pytest.raises(ValueError, match="expected 7 CSV fields"):
            forja_nvidia.parse_smi_csv("NVIDIA L4, 570.133.20\n")


def test_the_xml_report_gives_driver_and_cuda_versions():
    assert forja_nvidia.parse_smi_xml(SMI_XML) == {"driver_version": "570.133.20", "cuda_version": "12.8"}


@pytest.mark.parametrize(("text", "version"), [
    (PROC_PROPRIETARY, "535.216.03"),
    (PROC_OPEN, "550.54.15"),
    (PROC_TWO_PART, "595.84"),
    ("", None),
    ("GCC version:  gcc version 12.2.0\n", None),
])
def test_the_loaded_module_version_comes_from_proc(text, version):
    assert nvidia_facts.parse_proc_version(text) == version


@pytest.mark.parametrize(("path", "version"), [
    ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.133.20", "570.133.20"),
    ("/usr/lib64/libnvidia-ml.so.595.84", "595.84"),
    ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", None),
])
def test_the_nvml_library_carries_its_version_in_its_name(path, version):
    assert nvidia_facts.nvml_version_from_name(path) == version


@pytest.mark.parametrize(("deb", "upstream"), [
    ("570.172.08-0ubuntu1", "570.172.08"),
    ("570.211.01-0ubuntu1.22.04.1", "570.211.01"),
    ("1:570.172.08-1", "570.172.08"),
    ("12.8.1-1", "12.8.1"),
    ("5.15.0.9080.1", "5.15.0.9080.1"),
])
def test_debian_versions_reduce_to_the_upstream_version(deb, upstream):
    assert nvidia_facts.upstream_version(deb) == upstream


def test_the_apt_simulation_lists_installs_upgrades_and_removals():
    assert nvidia_facts.parse_apt_simulation(APT_SIMULATION) == [
        {"action": "Inst", "name": "cuda-toolkit-12-9", "from": None, "to": "12.9.1-1"},
        {"action": "Inst", "name": "cuda-toolkit", "from": "12.8.1-1", "to": "12.9.1-1"},
        {"action": "Inst", "name": "nvidia-driver-580", "from": None, "to": "580.95.05-0ubuntu1"},
        {"action": "Inst", "name": "nvidia-driver-570", "from": "570.172.08-0ubuntu1",
         "to": "580.95.05-0ubuntu1"},
        {"action": "Remv", "name": "libnvidia-compute-570", "from": "570.172.08-0ubuntu1", "to": None},
    ]


class TestPinViolations:
    def moves(self):
        return nvidia_facts.parse_apt_simulation(APT_SIMULATION)

    def test_every_move_off_570_and_128_is_a_violation(self):
        bad = nvidia_facts.pin_violations(self.moves(), "570", "12.8", held_kernel=False)
        assert [m["name"] for m in bad] == [
            "cuda-toolkit-12-9", "cuda-toolkit", "nvidia-driver-580", "nvidia-driver-570",
            "libnvidia-compute-570"]

    def test_an_upgrade_inside_the_branch_is_allowed(self):
        move = {"action": "Inst", "name": "nvidia-driver-570", "from": "570.133.20-0ubuntu1",
                "to": "570.172.08-0ubuntu1"}
        assert nvidia_facts.pin_violations([move], "570", "12.8", held_kernel=False) == []

    def test_a_570_named_package_at_a_580_version_is_caught_by_version(self):
        move = {"action": "Inst", "name": "libnvidia-compute-570", "from": "570.172.08-0ubuntu1",
                "to": "580.95.05-0ubuntu1"}
        assert nvidia_facts.pin_violations([move], "570", None, held_kernel=False) == [move]

    def test_kernel_moves_count_only_when_the_kernel_is_held(self):
        move = {"action": "Inst", "name": "linux-gcp", "from": "5.15.0.9080.1", "to": "5.15.0.9090.1"}
        libc = {"action": "Inst", "name": "linux-libc-dev", "from": "5.15.0-160.170", "to": "5.15.0-161.171"}
        assert nvidia_facts.pin_violations([move, libc], "570", "12.8", held_kernel=True) == [move]
        assert nvidia_facts.pin_violations([move, libc], "570", "12.8", held_kernel=False) == []


def test_dpkg_listing_keeps_installed_matching_packages_only():
    assert nvidia_facts.parse_dpkg_list(DPKG_LIST, "(nvidia-|libnvidia-|cuda-|linux-)") == {
        "cuda-drivers-570": "570.172.08-1",
        "linux-gcp": "5.15.0.9080.1",
        "nvidia-driver-570": "570.172.08-0ubuntu1",
    }


def make_pci(root: Path, address: str, vendor: str, klass: str, device: str) -> None:
    dev = root / "bus/pci/devices" / address
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(vendor + "\n")
    (dev / "class").write_text(klass + "\n")
    (dev / "device").write_text(device + "\n")


def test_an_l4_on_the_pci_bus_is_found_without_any_driver(tmp_path):
    make_pci(tmp_path, "0000:00:03.0", "0x10de", "0x030200", "0x27b8")
    make_pci(tmp_path, "0000:00:04.0", "0x1af4", "0x020000", "0x1000")  # virtio-net
    make_pci(tmp_path, "0000:00:05.0", "0x10de", "0x040300", "0x22bc")  # NVIDIA audio, not a GPU
    assert forja_nvidia.pci_gpus(str(tmp_path)) == [
        {"address": "0000:00:03.0", "device_id": "0x27b8", "class": "0x030200"}]


def test_no_pci_bus_means_no_gpu(tmp_path):
    assert forja_nvidia.pci_gpus(str(tmp_path)) == []


def test_cuda_toolkits_are_read_from_version_json(tmp_path):
    for folder, version in (("cuda-12.8", "12.8.1"), ("cuda-12.9", "12.9.1")):
        (tmp_path / folder).mkdir()
        report = {"cuda": {"name": "CUDA SDK", "version": version}}
        (tmp_path / folder / "version.json").write_text(json.dumps(report))
    (tmp_path / "cuda-11.0").mkdir()  # too old for version.json: ignored
    assert nvidia_facts.cuda_toolkits(str(tmp_path)) == {"12.8": "12.8.1", "12.9": "12.9.1"}


def test_the_nvml_library_is_found_through_its_soname_link(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libnvidia-ml.so.570.172.08").write_text("")
    (lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.570.172.08")
    found = nvidia_facts.find_nvml((str(tmp_path / "missing"), str(lib)))
    assert found == str(lib / "libnvidia-ml.so.570.172.08")


@pytest.mark.parametrize(("smi", "module", "nvml", "expected"), [
    ({"driver_version": "570.133.20"}, "570.124.06", "570.133.20", "570.133.20"),
    ({"driver_version": None}, "570.124.06", "570.133.20", "570.124.06"),
    ({"driver_version": None}, None, "570.172.08", "570.172.08"),
    ({"driver_version": None}, None, None, None),
])
def test_nvidia_smi_is_the_authority_on_the_driver_version(smi, module, nvml, expected):
    assert nvidia_facts.pick_driver_version(smi, module, nvml) == expected


@pytest.mark.parametrize(("version", "package", "dlvm", "source"), [
    (None, None, False, "none"),
    ("570.172.08", "libnvidia-compute-570", False, "apt"),
    ("570.133.20", None, False, "dlvm"),
    ("570.133.20", "libnvidia-compute-570", True, "dlvm"),
])
def test_the_source_says_who_installed_the_driver(version, package, dlvm, source):
    assert nvidia_facts.classify_source(version, package, dlvm) == source


def test_the_apt_inputs_digest_moves_with_any_file_apt_reads(tmp_path):
    status, etc = tmp_path / "status", tmp_path / "etc"
    status.write_text("Package: a\n")
    (etc / "preferences.d").mkdir(parents=True)
    paths = (str(status), str(etc))
    first = nvidia_facts.apt_inputs_digest(paths)
    assert nvidia_facts.apt_inputs_digest(paths) == first
    (etc / "preferences.d" / "pin.pref").write_text("Package: x\n")
    second = nvidia_facts.apt_inputs_digest(paths)
    assert second != first
    status.write_text("Package: b\n")  # same size, rewritten
    assert nvidia_facts.apt_inputs_digest(paths) != second


def test_a_simulation_cache_is_read_only_for_its_own_digest(tmp_path):
    cache = str(tmp_path / "cache" / "sim.json")
    assert nvidia_facts.read_simulation_cache(cache, "d1") is None
    nvidia_facts.write_simulation_cache(cache, "d1", [{"action": "Inst", "name": "x"}])
    assert nvidia_facts.read_simulation_cache(cache, "d1") == [{"action": "Inst", "name": "x"}]
    assert nvidia_facts.read_simulation_cache(cache, "d2") is None
    Path(cache).write_text("{not json")
    assert nvidia_facts.read_simulation_cache(cache, "d1") is None
