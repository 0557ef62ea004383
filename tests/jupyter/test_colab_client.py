"""forja_sandbox.colab drives a real notebook 6.5.7 server (the role's template) as Colab does."""

from __future__ import annotations

import pytest
from jupyter_helpers import LocalServer, render_config

from forja_sandbox.colab import CellError, ColabRefused, run_via_direct, run_via_http_over_ws

pytestmark = pytest.mark.slow
EVIL = "https://evil.example.com"
PATHS = pytest.mark.parametrize("run", [run_via_http_over_ws, run_via_direct], ids=["http_over_ws", "direct"])


def test_the_template_renders_the_security_settings_colab_needs():
    app = render_config()["NotebookApp"]
    assert app["ip"] == "127.0.0.1"
    assert app["port"] == 8888
    assert app["port_retries"] == 0
    assert app["allow_origin"] == "https://colab.research.google.com"
    assert app["allow_credentials"] is True
    assert app["allow_remote_access"] is False
    assert app["disable_check_xsrf"] is False
    assert app["nbserver_extensions"] == {"jupyter_http_over_ws": True}
    assert app["logging_config"]["handlers"]["console"]["filters"] == ["forja_redact"]


@PATHS
def test_a_cell_runs_and_its_stdout_comes_back(local_server: LocalServer, run):
    assert run(local_server.base_url, local_server.token, "print(1+1)") == "2\n"


def test_only_stdout_of_the_cell_is_returned(local_server: LocalServer):
    """Both paths share the message loop, so one path is enough here (each kernel costs seconds)."""
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\n40 + 2"
    assert run_via_direct(local_server.base_url, local_server.token, code) == "out\n"


def test_an_exception_in_the_cell_raises_cell_error(local_server: LocalServer):
    with pytest.raises(CellError) as raised:
        run_via_http_over_ws(local_server.base_url, local_server.token, "raise ValueError('boom')")
    assert raised.value.ename == "ValueError"
    assert raised.value.evalue == "boom"


@PATHS
@pytest.mark.parametrize("token", [None, "f" * 48], ids=["missing", "wrong"])
def test_a_missing_or_wrong_token_is_refused_with_403(local_server: LocalServer, run, token):
    with pytest.raises(ColabRefused) as refused:
        run(local_server.base_url, token, "print(1)")
    assert refused.value.status == 403


def test_another_origin_is_refused_at_the_websocket_handshake(local_server: LocalServer):
    with pytest.raises(ColabRefused) as refused:
        run_via_http_over_ws(local_server.base_url, local_server.token, "print(1)", origin=EVIL)
    assert refused.value.status == 403
    assert refused.value.stage == "http_over_ws socket handshake"


def test_the_token_never_reaches_the_server_log(local_server: LocalServer):
    """http_over_ws logs `302 GET /?token=...` at INFO for every auth-URL replay."""
    run_via_http_over_ws(local_server.base_url, local_server.token, "print('log me')")
    log = local_server.log.read_text()
    assert "token=[redacted]" in log, "the auth URL requests were not logged, so this proves nothing"
    assert local_server.token not in log
