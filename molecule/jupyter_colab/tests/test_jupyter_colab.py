"""The jupyter_colab role on a real host, checked the way Colab uses it: through a real SSH tunnel.

Controller-side checks (the Colab-like clients, the refusals) go through ``forja_sandbox.tunnel.ssh_tunnel``
to the host's loopback; host-side checks (files, processes, the journal) go through testinfra.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import websocket
import yaml

from forja_sandbox import testhosts
from forja_sandbox.colab import ColabRefused, run_via_direct, run_via_http_over_ws
from forja_sandbox.tunnel import Tunnel, ssh_tunnel

PORT = 18801  # converge.yml's jupyter_colab_port
TOKEN_FILE = "/var/lib/forja/jupyter/token"
CONFIG_FILE = "/etc/forja/jupyter/jupyter_notebook_config.json"
VENV_PYTHON = "/opt/forja/jupyter/bin/python"
EVIL_ORIGIN = "https://evil.example.com"
KERNEL_ENV = "/home/jupyter/kernels/python3"  # the default kernel's environment (jupyter_colab_kernels_dir)
IMAGE_TORCH = "/usr/local/lib/python3.10/dist-packages/torch"  # where the dlvm layer keeps PyTorch
SMALL_PACKAGE = "termcolor==2.4.0"  # small, pure Python, not in the image
# A first Colab cell: the interpreter, PyTorch, and a few training steps.
TORCH_CELL = """
import sys, torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(256, 4)
y = x.sum(dim=1, keepdim=True)
for _ in range(100):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
print(sys.executable, torch.__version__, torch.__file__, torch.cuda.device_count(), loss.item() < 0.01)
"""


# --------------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def instance(host) -> dict:
    """The test host's address, login user and key, as molecule's create step recorded them.

    Every fixture hangs off testinfra's ``host`` so that pytest keeps the tests in file order
    (it groups tests by the parametrized ``host``): the crash test must come last.
    """
    entries = yaml.safe_load(Path(os.environ["MOLECULE_INSTANCE_CONFIG"]).read_text())
    return next(e for e in entries if e["instance"] == "th1")


@pytest.fixture(scope="module")
def token_path(host) -> Path:
    return Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "jupyter-token"


@pytest.fixture(scope="module")
def token(token_path: Path) -> str:
    """The token as the role fetched it to the controller."""
    return token_path.read_text()


def _tunnel(instance: dict, local_port: int, remote_port: int = PORT):
    return ssh_tunnel(
        instance["address"], instance["user"], instance["identity_file"], local_port, remote_port,
        strict_host_key_checking="no", known_hosts_file="/dev/null",
    )


@pytest.fixture(scope="module")
def tunnel(instance: dict):
    """`ssh -N -L 18801:127.0.0.1:18801`: equal ports, as the role tells users to do."""
    with _tunnel(instance, PORT) as open_tunnel:
        yield open_tunnel


def _sudo(host, command: str) -> str:
    with host.sudo():
        return host.check_output(command)


# --------------------------------------------------------------------------------------------------
# The service


def test_service_is_enabled_and_runs_as_the_unprivileged_user(host):
    service = host.service("forja-jupyter")
    assert service.is_enabled
    assert service.is_running
    pid = _sudo(host, "systemctl show -p MainPID --value forja-jupyter")
    assert host.check_output(f"ps -o user= -p {pid}").strip() == "jupyter"


def test_server_listens_on_loopback_only(host, instance: dict):
    assert host.socket(f"tcp://127.0.0.1:{PORT}").is_listening
    uid = host.user("jupyter").uid
    listeners = _sudo(host, "ss -Hltne").splitlines()
    mine = [line.split()[3] for line in listeners if f"uid:{uid} " in line + " "]
    assert mine, "the jupyter user owns no listening socket"
    assert all(addr.startswith("127.0.0.1:") for addr in mine), mine
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((instance["address"], PORT), timeout=5).close()


def test_configuration_is_locked_down(host):
    with host.sudo():
        config = host.file(CONFIG_FILE)
        assert config.user == "root"
        assert config.mode & 0o007 == 0
    app = json.loads(_sudo(host, f"cat {CONFIG_FILE}"))["NotebookApp"]
    assert app["ip"] == "127.0.0.1"
    assert app["allow_origin"] == "https://colab.research.google.com"
    assert "allow_origin_pat" not in app
    assert app["allow_credentials"] is True
    assert app["allow_remote_access"] is False
    assert app["disable_check_xsrf"] is False
    assert app["port_retries"] == 0
    assert "token" not in app


def test_a_busy_port_stops_a_second_server_instead_of_moving_it(host):
    """port_retries=0 spelled so that notebook 6.5.7 obeys it: no silent hop to PORT+1."""
    with host.sudo():
        run = host.run(
            "runuser -u jupyter -- env HOME=/home/jupyter JUPYTER_CONFIG_DIR=/etc/forja/jupyter "
            f"JUPYTER_TOKEN_FILE={TOKEN_FILE} timeout 60 /opt/forja/jupyter/bin/jupyter-notebook"
        )
    assert run.rc not in (0, 124)
    assert f"port {PORT} is already in use" in run.stderr
    assert not host.socket(f"tcp://127.0.0.1:{PORT + 1}").is_listening


# --------------------------------------------------------------------------------------------------
# Pins and the extension


def test_extension_imports_with_its_cookie_fix_on_current_tornado(host):
    probe = host.check_output(
        f"{VENV_PYTHON} -W ignore -c 'import tornado, distutils, jupyter_http_over_ws, notebook; "
        "print(tornado.version, notebook.__version__, distutils.__file__)'"
    ).split()
    assert tuple(int(x) for x in probe[0].split(".")[:2]) >= (6, 5)
    assert probe[1] == "6.5.7"
    assert "setuptools" in probe[2], "distutils must come from setuptools (gone from Python 3.12)"
    handlers = host.file(probe[2].split("/setuptools/")[0] + "/jupyter_http_over_ws/handlers.py")
    assert handlers.contains(r"output(attrs=\[\], header='').strip())")
    assert host.run(f"{VENV_PYTHON} -m pip check").rc == 0


# --------------------------------------------------------------------------------------------------
# The token


def test_token_file_is_private_and_has_no_trailing_newline(host, token: str, token_path: Path):
    with host.sudo():
        on_host = host.file(TOKEN_FILE)
        assert on_host.user == "jupyter"
        assert on_host.mode == 0o600
        assert host.file(os.path.dirname(TOKEN_FILE)).mode == 0o700
    content = _sudo(host, f"cat {TOKEN_FILE}")
    assert content == token
    assert len(token) == 48 and all(c in "0123456789abcdef" for c in token)
    assert not token_path.read_bytes().endswith(b"\n")
    assert token_path.stat().st_mode & 0o777 == 0o600


def test_token_is_on_no_command_line(host, token: str):
    cmdlines = _sudo(host, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert "jupyter-notebook" in cmdlines
    assert token not in cmdlines


# --------------------------------------------------------------------------------------------------
# Colab's two ways in, through the tunnel


def test_colab_http_over_ws_path_runs_a_cell(tunnel: Tunnel, token: str):
    assert run_via_http_over_ws(tunnel.base_url, token, "print(1+1)") == "2\n"


def test_colab_direct_cors_path_runs_a_cell(tunnel: Tunnel, token: str):
    assert run_via_direct(tunnel.base_url, token, "print(1+1)") == "2\n"


def test_cors_preflight_allows_colab_with_credentials(tunnel: Tunnel):
    reply = requests.options(
        f"{tunnel.base_url}/api/kernels",
        headers={"Origin": "https://colab.research.google.com", "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    assert reply.headers["Access-Control-Allow-Origin"] == "https://colab.research.google.com"
    assert reply.headers["Access-Control-Allow-Credentials"] == "true"


def test_another_origin_is_refused_at_the_handshake(tunnel: Tunnel, token: str):
    with pytest.raises(ColabRefused) as refused:
        run_via_http_over_ws(tunnel.base_url, token, "print(1+1)", origin=EVIL_ORIGIN)
    assert refused.value.status == 403
    assert "handshake" in refused.value.stage


@pytest.mark.parametrize("run", [run_via_http_over_ws, run_via_direct], ids=["http_over_ws", "direct"])
@pytest.mark.parametrize("bad_token", [None, "0" * 48], ids=["missing", "wrong"])
def test_a_missing_or_wrong_token_is_refused(tunnel: Tunnel, run, bad_token):
    with pytest.raises(ColabRefused) as refused:
        run(tunnel.base_url, bad_token, "print(1+1)")
    assert refused.value.status == 403


def test_a_non_loopback_host_header_is_refused(tunnel: Tunnel, token: str):
    """DNS rebinding guard: a page on evil.example.com resolving to 127.0.0.1 gets nothing."""
    reply = requests.get(
        f"{tunnel.base_url}/api/kernels",
        params={"token": token}, headers={"Host": "evil.example.com"}, timeout=10,
    )
    assert reply.status_code == 403
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            f"ws://127.0.0.1:{PORT}/http_over_websocket/diagnose",
            origin="https://colab.research.google.com", host="evil.example.com", timeout=10,
        )
    assert refused.value.status_code == 403


def test_unequal_tunnel_ports_break_http_over_ws_but_not_direct(instance: dict, token: str):
    """Why the role insists on equal ports: the extension calls itself at the browser's Host."""
    with _tunnel(instance, PORT + 1000) as mismatched:
        assert run_via_direct(mismatched.base_url, token, "print(3*7)") == "21\n"
        with pytest.raises(ColabRefused) as broken:
            run_via_http_over_ws(mismatched.base_url, token, "print(3*7)")
    assert broken.value.status == 500


# --------------------------------------------------------------------------------------------------
# The kernel is the image's PyTorch


@pytest.mark.parametrize("run", [run_via_http_over_ws, run_via_direct], ids=["http_over_ws", "direct"])
def test_the_default_kernel_imports_the_images_pytorch_and_trains(tunnel: Tunnel, token: str, run):
    out = run(tunnel.base_url, token, TORCH_CELL, timeout_s=120)
    executable, version, torch_file, gpus, learned = out.split()
    assert executable == f"{KERNEL_ENV}/bin/python"
    assert version.startswith("2.7.1")
    assert torch_file.startswith(IMAGE_TORCH), "the kernel must use the image's PyTorch, not a copy"
    assert gpus == "0"  # the test host has no GPU; on the L4 this is the GPU count
    assert learned == "True"


def test_kernel_specs_make_the_pytorch_kernel_the_default_and_add_the_extra_one(tunnel: Tunnel, token: str):
    specs = requests.get(f"{tunnel.base_url}/api/kernelspecs", params={"token": token}, timeout=10).json()
    assert specs["default"] == "python3"
    default = specs["kernelspecs"]["python3"]["spec"]
    assert default["argv"][0] == f"{KERNEL_ENV}/bin/python"
    assert default["env"]["PIP_CONSTRAINT"] == f"{KERNEL_ENV}/forja-constraints.txt"
    assert "PyTorch 2.7.1" in default["display_name"]
    extra = specs["kernelspecs"]["torch-extra"]["spec"]
    assert extra["argv"][0] == "/home/jupyter/kernels/torch-extra/bin/python"


def test_kernel_environments_belong_to_the_user_and_their_specs_to_root(host):
    with host.sudo():
        assert host.file(KERNEL_ENV).user == "jupyter"
        assert host.file(f"{KERNEL_ENV}/lib/python3.10/site-packages").user == "jupyter"
        spec = host.file("/opt/forja/jupyter-kernels/kernels/python3/kernel.json")
        assert spec.user == "root" and spec.mode == 0o644
        constraint = host.file(f"{KERNEL_ENV}/forja-constraints.txt").content_string
        assert "torch==2.7.1" in constraint.splitlines()
        assert not host.file(f"{KERNEL_ENV}/lib/python3.10/site-packages/torch").exists


def test_pip_install_from_a_notebook_lands_in_the_kernel_environment(tunnel: Tunnel, token: str):
    cell = f"%pip install --progress-bar off {SMALL_PACKAGE}"
    out = run_via_direct(tunnel.base_url, token, cell, timeout_s=180)
    assert "Successfully installed termcolor" in out or "already satisfied" in out, out
    where = run_via_http_over_ws(tunnel.base_url, token,
                                 "import termcolor, torch; print(termcolor.__file__, torch.__file__)").split()
    assert where[0].startswith(f"{KERNEL_ENV}/lib/python3.10/site-packages/")
    assert where[1].startswith(IMAGE_TORCH)


def test_pip_in_a_notebook_cannot_replace_the_images_pytorch(host, tunnel: Tunnel, token: str):
    cell = "%pip install --progress-bar off torch==2.6.0"
    out = run_via_direct(tunnel.base_url, token, cell, timeout_s=180)
    assert "Successfully installed" not in out
    assert "torch==2.6.0" in out and ("conflict" in out.lower() or "constraint" in out.lower()), out
    after = run_via_direct(tunnel.base_url, token, "import torch; print(torch.__version__, torch.__file__)")
    assert after.split()[1].startswith(IMAGE_TORCH)
    assert _sudo(host, f"runuser -u jupyter -- {KERNEL_ENV}/bin/python -m pip check").startswith("No broken")


def test_a_kernel_interpreter_without_pytorch_is_refused_before_anything_changes(instance: dict,
                                                                                  tmp_path: Path):
    """Bad input: the server's own venv has no torch; naming it stops the play with the variable's name."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"th1": {
        "ansible_host": instance["address"], "ansible_user": instance["user"],
        "ansible_ssh_private_key_file": instance["identity_file"],
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}}}))
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"name": "Apply the role", "hosts": "all", "become": True,
                                     "gather_facts": False, "roles": ["forja.gpu.jupyter_colab"]}]))
    repo = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
    env = {**os.environ, "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    run = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), str(play),
         "-e", f"jupyter_colab_kernel_python={VENV_PYTHON}", "-e", f"jupyter_colab_port={PORT}"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode != 0
    assert f"jupyter_colab_kernel_python={VENV_PYTHON} has no PyTorch" in run.stdout, run.stdout[-3000:]
    assert "changed=0" in run.stdout


# --------------------------------------------------------------------------------------------------
# Where the token must never show up (after the Colab-like sessions above)


def test_token_is_in_no_log_and_no_world_readable_file(host, tunnel: Tunnel, token: str):
    run_via_http_over_ws(tunnel.base_url, token, "print('session for the log check')")
    journal = _sudo(host, "journalctl -u forja-jupyter --no-pager -o cat")
    assert "token=[redacted]" in journal, "the proxied requests were not logged: the check proves nothing"
    assert token not in journal
    readable_journals = _sudo(
        host, "find /var/log/journal /run/log/journal -type f -perm -o=r 2>/dev/null || true"
    )
    assert readable_journals.strip() == ""
    with host.sudo():
        scan = host.run(
            "find / /run /tmp /var/tmp /dev/shm -xdev -type f -perm -o=r -print0 2>/dev/null"
            f" | xargs -0 grep -lF -f {TOKEN_FILE} 2>/dev/null"
        )
    assert scan.stdout.strip() == "", f"world-readable files hold the token: {scan.stdout}"


# --------------------------------------------------------------------------------------------------
# Resilience (last: it restarts the server)


def test_service_comes_back_after_a_crash(host, tunnel: Tunnel, token: str):
    before = _sudo(host, "systemctl show -p MainPID --value forja-jupyter").strip()
    _sudo(host, f"kill -9 {before}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = _sudo(host, "systemctl show -p MainPID --value forja-jupyter").strip()
        if after not in ("0", before) and host.socket(f"tcp://127.0.0.1:{PORT}").is_listening:
            break
        time.sleep(1)
    else:
        pytest.fail("forja-jupyter did not come back within 60 s of being killed")
    assert run_via_direct(tunnel.base_url, token, "print(1+1)") == "2\n"


def test_kernel_packages_survive_a_restart_of_the_service_and_of_the_host(host, instance: dict,
                                                                          tunnel: Tunnel, token: str):
    """Last: it restarts the server, then halts and boots the host (its disk kept, as a stopped VM).

    After the reboot the module's tunnel is gone with the old sshd, so a new one (on another local
    port: the old one may still hold ours) carries Colab's direct path.
    """
    _sudo(host, "systemctl restart forja-jupyter")
    _wait_listening(host)
    assert run_via_direct(tunnel.base_url, token, "import termcolor; print('ok')") == "ok\n"
    testhosts.stop(1)
    testhosts.up(1, image="dlvm")
    deadline = time.monotonic() + 120
    while True:  # the unit starts at boot; the tunnel needs sshd and the server
        try:
            with _tunnel(instance, PORT + 2000) as after_boot:
                out = run_via_direct(after_boot.base_url, token,
                                     "import termcolor, torch; print(torch.__version__)", timeout_s=60)
            break
        except (OSError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(2)
    assert out.startswith("2.7.1")


def _wait_listening(host, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not host.socket(f"tcp://127.0.0.1:{PORT}").is_listening:
        if time.monotonic() > deadline:
            pytest.fail(f"forja-jupyter did not listen on {PORT} within {timeout_s} s")
        time.sleep(1)
