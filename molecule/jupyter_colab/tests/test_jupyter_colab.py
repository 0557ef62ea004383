"""The jupyter_colab role on a real host, checked the way Colab uses it: through a real SSH tunnel.

Controller-side checks (the Colab-like clients, the refusals) go through ``forja.tunnel.ssh_tunnel``
to the host's loopback; host-side checks (files, processes, the journal) go through testinfra.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import requests
import websocket
import yaml

from forja.colab import ColabRefused, run_via_direct, run_via_http_over_ws
from forja.tunnel import Tunnel, ssh_tunnel

PORT = 18801  # converge.yml's jupyter_colab_port
TOKEN_FILE = "/var/lib/forja/jupyter/token"
CONFIG_FILE = "/etc/forja/jupyter/jupyter_notebook_config.json"
VENV_PYTHON = "/opt/forja/jupyter/bin/python"
EVIL_ORIGIN = "https://evil.example.com"


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
