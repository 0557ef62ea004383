"""The dashboard server's own rules, without a browser: where it listens and what a taken port says."""

from __future__ import annotations

import socket

import pytest

from forja.errors import ConfigError
from forja.ui.server import BIND, listen


def test_a_taken_port_is_an_error_naming_the_option_and_the_fix() -> None:
    with socket.socket() as taken:
        taken.bind((BIND, 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match="--port") as caught:
            listen(port)
    message = caught.value.message
    assert f"127.0.0.1:{port} is taken" in message and "0 for any free one" in message


def test_port_zero_takes_a_free_port_on_the_loopback() -> None:
    sock = listen(0)
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
    finally:
        sock.close()
