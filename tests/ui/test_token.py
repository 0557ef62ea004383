"""The dashboard's token: asked for on every data request, as a header; never a cookie, never a
redirect, never on the command line. Starlette's own test client drives the real app; the command
is run through typer's runner. The browser side (the token kept in the tab, a second local server
that gets nothing) is tests/ui/test_dashboard.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from forja.api import Forja
from forja.cli import app
from forja.errors import ExitCode
from forja.history import History
from forja.ui.server import Dashboard, make_app

TOKEN = "the-right-token"


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    board = Dashboard(Forja(tmp_path, history=History(tmp_path / "history.sqlite")), ["http://127.0.0.1:1/"])
    with TestClient(make_app(board, TOKEN, collect=False), base_url="http://127.0.0.1") as test_client:
        yield test_client


def test_data_needs_the_token_header_and_nothing_else_opens_it(client: TestClient) -> None:
    for path in ("/api/runs", "/api/live", "/api/vm", "/api/runs/x", "/api/runs/x/plots/loss.png"):
        assert client.get(path).status_code == 403, path
        assert client.get(path, headers={"Authorization": "token wrong"}).status_code == 403, path
        assert client.get(f"{path}?token={TOKEN}").status_code == 403, f"{path}: a URL token opens nothing"
        cookie = {"Cookie": f"forja_ui_token={TOKEN}"}  # what the old page set
        assert client.get(path, headers=cookie).status_code == 403, f"{path}: nor a cookie"
    assert client.get("/api/runs", headers={"Authorization": f"token {TOKEN}"}).json() == {"runs": []}


def test_the_page_holds_no_data_sets_no_cookie_and_never_redirects(client: TestClient) -> None:
    for path in (f"/?token={TOKEN}", f"//evil.example/?token={TOKEN}", "/static/app.js"):
        reply = client.get(path, follow_redirects=False)
        assert reply.status_code in (200, 404) and "location" not in reply.headers, path
        assert "set-cookie" not in reply.headers, path
    page = client.get("/")
    assert page.status_code == 200 and "<html" in page.text
    assert "blob:" in page.headers["content-security-policy"]  # the plots are shown from memory


def test_a_rebound_host_name_is_refused(client: TestClient) -> None:
    reply = client.get("/api/runs", headers={"Authorization": f"token {TOKEN}", "Host": "attacker.example"})
    assert reply.status_code == 400


runner = CliRunner()


def test_a_token_on_the_command_line_is_refused_naming_the_safe_ways() -> None:
    result = runner.invoke(app, ["ui", "--token", "visible-in-ps"])
    assert result.exit_code == ExitCode.USAGE
    assert "--token-file" in result.output and "FORJA_UI_TOKEN" in result.output


def test_a_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o644)
    result = runner.invoke(app, ["ui", "--token-file", str(path)])
    assert result.exit_code == ExitCode.USAGE and f"chmod 600 {path}" in result.output


@pytest.mark.parametrize(
    ("port", "said"), [("99999", "less than or equal to 65535"), ("-1", "greater than or equal to 0")]
)
def test_a_port_out_of_range_is_a_clear_error(port: str, said: str) -> None:
    result = runner.invoke(app, ["ui", "--port", port])
    assert result.exit_code == ExitCode.USAGE and "Invalid value for '--port'" in result.output
    assert said in " ".join(result.output.split()), result.output
