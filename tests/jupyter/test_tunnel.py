"""forja.tunnel builds a strict ssh command, refuses a busy port and reports why ssh gave up.

The real tunnel to a test host is exercised by the molecule scenario jupyter_colab (its verifier
runs every Colab-like check through ``ssh_tunnel``); these tests need no host.
"""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from forja.tunnel import ssh_command
from forja_sandbox.tunnel import TunnelError, port_is_free, ssh_tunnel


def test_the_command_forwards_loopback_to_loopback_with_safe_options():
    argv = ssh_command("10.0.0.5", "alice", "/keys/id", 8888, 8888)
    assert argv[:2] == ["ssh", "-N"]
    assert argv[-3:] == ["-L", "127.0.0.1:8888:127.0.0.1:8888", "alice@10.0.0.5"]
    options = {argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"}
    assert {"BatchMode=yes", "ExitOnForwardFailure=yes", "StrictHostKeyChecking=accept-new",
            "IdentitiesOnly=yes"} <= options
    assert argv[argv.index("-i") + 1] == "/keys/id"


def test_the_host_key_policy_and_known_hosts_file_are_passed_through():
    argv = ssh_command("h", "u", None, 1, 2, port=2222, strict_host_key_checking="no",
                       known_hosts_file="/dev/null")
    assert "StrictHostKeyChecking=no" in argv
    assert "UserKnownHostsFile=/dev/null" in argv
    assert argv[argv.index("-p") + 1] == "2222"
    assert "-i" not in argv


def test_a_busy_local_port_is_refused_before_ssh_starts():
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        assert not port_is_free(port)
        with pytest.raises(TunnelError, match=f"local port {port} is already in use"), \
                ssh_tunnel("127.0.0.1", "nobody", None, port):
            pass


def test_a_port_whose_last_tunnel_just_closed_is_free_again():
    # The listener side closes first, as a tunnel does when it ends: its connection lingers in
    # TIME_WAIT on the port for a minute. ssh binds through that; so must the check.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()
        client.close()
    assert "TIME-WAIT" in subprocess.run(["ss", "-tan", f"sport = :{port}"], capture_output=True,
                                         text=True, check=True).stdout
    assert port_is_free(port)


def test_ssh_giving_up_raises_with_its_own_message_and_leaves_no_process():
    with socket.socket() as probe:  # a port with nothing behind it: ssh's connection is refused
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    local = dead_port  # free as well, now that the probe is closed
    started = time.monotonic()
    with pytest.raises(TunnelError, match="ssh exited with status 255") as failed, \
            ssh_tunnel("127.0.0.1", "nobody", None, local, 8888, port=dead_port,
                       strict_host_key_checking="no", known_hosts_file="/dev/null"):
        pass
    assert "Connection refused" in str(failed.value)
    assert time.monotonic() - started < 15
    leftover = subprocess.run(["pgrep", "-f", f"127.0.0.1:{local}:127.0.0.1:8888"],
                              capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == ""
