"""A sandbox VM boots the image it asked for: the Deep Learning VM layer for a DLVM boot disk."""

from __future__ import annotations

from emulator_helpers import ZONE, Client, l4_body, small_body

from forja_sandbox.backend import image_of
from forja_sandbox.compute_emulator import ComputeEmulator


def test_a_dlvm_boot_disk_boots_the_dlvm_layer_and_ubuntu_boots_plain(emu: ComputeEmulator,
                                                                      client: Client) -> None:
    client.insert(l4_body("trainer"))
    client.insert(small_body("plain"))
    trainer = client.ok(client.get(f"zones/{ZONE}/instances/trainer"))
    plain = client.ok(client.get(f"zones/{ZONE}/instances/plain"))
    assert image_of(trainer) == "dlvm"
    assert image_of(plain) == "golden"


def test_only_the_boot_disk_decides() -> None:
    license_ = "https://compute.googleapis.com/compute/v1/projects/deeplearning-platform-release/global/licenses/x"
    assert image_of({"disks": [{"boot": False, "licenses": [license_]}]}) == "golden"
    assert image_of({"disks": [{"boot": True, "licenses": [license_]}]}) == "dlvm"
    assert image_of({}) == "golden"
