"""roles/dataset on a real test host (th40): playbooks/data.yml pushes a folder from the controller to
the storage emulator and stages it onto the host's disk; a re-run changes nothing; a deleted and an
altered file are put back. The host reaches the emulator on the hosts' bridge through the sandbox's
BridgeRelay, as the sandbox's VMs do.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import playout
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from forja_sandbox import testhosts
from forja_sandbox.service import PROJECT
from forja_sandbox.storage_emulator import BridgeRelay, StorageEmulator, free_port

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
INDEX = 40  # the dataset tests' reserved test host
PLAY = ROOT / "playbooks" / "data.yml"
DATA_DIR = "/var/lib/forja/data"  # host_contract_data_dir's default
BUCKET = "forja-datasets-th40"


@dataclass
class Site:
    host: testhosts.Host
    inventory: Path
    extra: list[str]

    def ssh(self, script: str) -> str:
        return self.host.run_as_root(script)

    def play(self, *extra: str) -> tuple[int, str]:
        playbook = str(Path(sys.executable).with_name("ansible-playbook"))
        proc = subprocess.run(
            [playbook, "-i", str(self.inventory), *self.extra, *extra, str(PLAY)],
            cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
            env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
                 "ANSIBLE_FORCE_COLOR": "0"})
        return proc.returncode, proc.stdout + proc.stderr


def changed(out: str) -> int:
    return sum(counts["changed"] for counts in playout.recap(out).values())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    folder = tmp_path_factory.mktemp("dataset-role")
    testhosts.down(INDEX)
    host = testhosts.up(INDEX)
    emulator = StorageEmulator(data_dir=folder / "gcs").start()
    bridge = f"{testhosts.net_prefix()}.1"
    relay_port = free_port(bridge)
    relay = BridgeRelay(bridge, relay_port, (emulator.host, emulator.port)).start()
    try:
        client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": emulator.url})
        client.create_bucket(BUCKET)
        inventory = folder / "hosts.ini"
        inventory.write_text(
            "[forja_gpu]\n"
            f"th{INDEX} ansible_host={host.address} ansible_user={host.user} "
            f"ansible_ssh_private_key_file={host.key}\n"
            "[forja_gpu:vars]\n"
            f"ansible_ssh_common_args='{' '.join(testhosts.SSH_OPTIONS)}'\n")
        extra = ["-e", f"dataset_bucket=gs://{BUCKET}",
                 "-e", f"dataset_storage_emulator_host={emulator.url}",
                 "-e", f"dataset_host_storage_emulator_host=http://{bridge}:{relay_port}"]
        yield Site(host, inventory, extra)
    finally:
        relay.stop()
        emulator.stop()
        testhosts.down(INDEX)


def test_a_pushed_dataset_is_staged_then_left_alone_then_repaired(site: Site, tmp_path: Path) -> None:
    src = tmp_path / "digits"
    files = {f"train/shard-{i}.txt": f"sample {i}\n".encode() * 200 for i in range(12)}
    files["val/big.bin"] = os.urandom(3 * 1024 * 1024)
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    (src / ".env").write_text("SECRET=1\n")
    want = "\n".join(f"{hashlib.sha256(d).hexdigest()}  {rel}" for rel, d in sorted(files.items())) + "\n"

    rc, out = site.play("-e", f"dataset_src={src}", "-e", "dataset_name=digits")
    assert rc == 0 and changed(out) >= 2, out[-4000:]
    listing = site.ssh(f"cd {DATA_DIR}/digits && find . -type f ! -name .forja-dataset.json | sort | "
                       "sed 's|^./||' | xargs sha256sum")
    assert listing == want, listing
    marker_and_mode = site.ssh(f"test -f {DATA_DIR}/digits/.forja-dataset.json && stat -c %a {DATA_DIR}")
    assert marker_and_mode.strip() == "755"
    assert ".env" not in site.ssh(f"ls -A {DATA_DIR}/digits")

    rc, out = site.play("-e", f"dataset_src={src}", "-e", "dataset_name=digits")
    assert rc == 0 and changed(out) == 0, out[-4000:]

    site.ssh(f"rm {DATA_DIR}/digits/train/shard-3.txt; echo altered > {DATA_DIR}/digits/val/big.bin; "
             f"touch {DATA_DIR}/digits/train/stray")
    rc, out = site.play("-e", "dataset_name=digits", "-v")  # stage only: the bucket has it
    assert rc == 0 and changed(out) == 1, out[-4000:]
    results = playout.task_results(out)
    staged = results["forja.gpu.dataset : Copy the dataset onto the host's disk, verifying each file"]
    assert "train/shard-3.txt" in staged and "val/big.bin" in staged and "train/stray" in staged, staged
    assert site.ssh(f"cd {DATA_DIR}/digits && find . -type f ! -name .forja-dataset.json | sort | "
                    "sed 's|^./||' | xargs sha256sum") == want


def test_a_dataset_never_pushed_fails_naming_it_and_changes_nothing(site: Site) -> None:
    rc, out = site.play("-e", "dataset_name=never-pushed")
    assert rc != 0 and "push it first" in out and "never-pushed" in out, out[-4000:]
    assert site.ssh(f"test -e {DATA_DIR}/never-pushed && echo there || echo absent").strip() == "absent"


def test_bad_names_and_buckets_fail_before_anything_runs(site: Site) -> None:
    rc, out = site.play("-e", "dataset_name=bad name", "-e", "dataset_bucket=s3://x")
    assert rc != 0, out[-3000:]
    assert "dataset_name must be" in out and "dataset_bucket must be gs://BUCKET" in out, out[-3000:]
    assert "Copy the dataset" not in out


def test_without_a_bucket_the_dataset_goes_straight_to_the_host_and_is_verified(
    site: Site, tmp_path: Path
) -> None:
    src = tmp_path / "direct"
    files = {f"part-{i}.txt": f"row {i}\n".encode() * 300 for i in range(8)}
    files["deep/big.bin"] = os.urandom(2 * 1024 * 1024)
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    (src / "id_ed25519").write_text("not sent\n")
    want = "\n".join(f"{hashlib.sha256(d).hexdigest()}  {rel}" for rel, d in sorted(files.items())) + "\n"
    direct = ["-e", '{"dataset_bucket": ""}', "-e", f"dataset_src={src}", "-e", "dataset_name=direct",
              "-e", f"dataset_plan_dir={tmp_path / 'plans'}"]
    listing = (f"cd {DATA_DIR}/direct && find . -type f ! -name .forja-dataset.json | sort | sed 's|^./||' | "
               "xargs sha256sum")

    rc, out = site.play(*direct)
    assert rc == 0 and changed(out) > 0, out[-4000:]
    assert site.ssh(listing) == want
    assert site.ssh(f"test -f {DATA_DIR}/direct/.forja-dataset.json && echo marked").strip() == "marked"

    rc, out = site.play(*direct)
    assert rc == 0 and changed(out) == 0, out[-4000:]

    site.ssh(f"rm {DATA_DIR}/direct/part-2.txt; echo altered > {DATA_DIR}/direct/deep/big.bin")
    rc, out = site.play(*direct, "-v")
    assert rc == 0, out[-4000:]
    task = ("forja.gpu.dataset : Compare the host's copy with the manifest and check the space for what "
            "is missing")
    prepared = playout.task_results(out)[task]
    assert "part-2.txt" in prepared and "deep/big.bin" in prepared, prepared
    sent = "forja.gpu.dataset : Send the missing files over the inventory's SSH connection"
    assert sent in playout.changed_tasks(out)
    assert site.ssh(listing) == want


def test_the_api_sends_straight_to_the_host_when_asked(site: Site, tmp_path: Path, monkeypatch) -> None:
    from forja.api import Forja

    monkeypatch.setenv("FORJA_HOME", str(tmp_path / "home"))
    src = tmp_path / "api-direct"
    src.mkdir()
    (src / "a.txt").write_bytes(b"through forja's runner\n")
    result = Forja(inventory=str(site.inventory), host_key_checking=False).push_data(src, to_host=True)
    assert result.status == "successful", result
    got = site.ssh(f"cat {DATA_DIR}/api-direct/a.txt; "
                   f"test -f {DATA_DIR}/api-direct/.forja-dataset.json && echo ok")
    assert got == "through forja's runner\nok\n"
