"""The Deep Learning VM layer: a host booted from it has the image's PyTorch where the sandbox says.

Checked on real hosts th23 (dlvm) and th24 (golden), against the facts the layer claims to
reproduce (forja_sandbox/README.md): PyTorch 2.7.1 for Python 3.10 in the image's own Python,
root-owned, no conda, pip and torchrun on PATH; and a host keeps its layers across stop and start.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from forja_sandbox import testhosts

DLVM, GOLDEN = 23, 24
PROBE = ("import json, sys, torch; print(json.dumps({'torch': torch.__version__,"
         " 'python': sys.version.split()[0], 'file': torch.__file__, 'exe': sys.executable}))")

pytestmark = [pytest.mark.hosts, pytest.mark.slow]


def _ssh(host: testhosts.Host, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(host.ssh_argv(command, options=("-o", "ConnectTimeout=10")),
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def hosts():
    dlvm = testhosts.up(DLVM, image="dlvm")
    golden = testhosts.up(GOLDEN)
    yield dlvm, golden
    testhosts.down(DLVM)
    testhosts.down(GOLDEN)


def test_the_images_python_has_pytorch_2_7_1_for_python_3_10(hosts):
    dlvm, _ = hosts
    said = json.loads(_ssh(dlvm, f"/usr/bin/python3 -W ignore -c \"{PROBE}\"").stdout)
    assert said["torch"].startswith("2.7.1")
    assert said["python"].startswith("3.10.")
    assert said["file"] == "/usr/local/lib/python3.10/dist-packages/torch/__init__.py"
    assert _ssh(dlvm, "stat -c %U /usr/local/lib/python3.10/dist-packages/torch").stdout.strip() == "root"
    on_path = _ssh(dlvm, "command -v torchrun pip").stdout.split()
    assert on_path == ["/usr/local/bin/torchrun", "/usr/local/bin/pip"]
    assert _ssh(dlvm, "test -e /opt/conda").returncode != 0, "post-M128 DLVM images have no conda"


def test_a_golden_host_has_no_pytorch(hosts):
    _, golden = hosts
    assert _ssh(golden, "/usr/bin/python3 -c 'import torch'").returncode != 0


def test_a_stopped_host_boots_its_own_layers_again(hosts):
    dlvm, _ = hosts
    assert _ssh(dlvm, "sudo touch /var/tmp/kept && echo ok").stdout.strip() == "ok"
    testhosts.stop(DLVM)
    testhosts.up(DLVM)  # asked for the plain image: the host's own layers win, as a VM keeps its disk
    assert _ssh(dlvm, "test -e /var/tmp/kept && /usr/bin/python3 -c 'import torch' 2>/dev/null && echo ok"
                ).stdout.strip() == "ok"
