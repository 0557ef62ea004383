"""The role's log filter keeps the Jupyter token out of every line the server logs."""

from __future__ import annotations

import importlib.util
import io
import logging
import sys
from pathlib import Path

import pytest
from jupyter_helpers import ROLE

_spec = importlib.util.spec_from_file_location("forja_redact_log", ROLE / "files" / "forja_redact_log.py")
assert _spec and _spec.loader
redact_log = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(redact_log)

TOKEN = "3f1c9a0b7d2e4f6a8b0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (f"302 GET /?token={TOKEN} (127.0.0.1) 1.2ms", "302 GET /?token=[redacted] (127.0.0.1) 1.2ms"),
        (f"GET /api/kernels?token={TOKEN}&x=1", "GET /api/kernels?token=[redacted]&x=1"),
        (f"auth_url=http%3A%2F%2Flocalhost%3A8888%2F%3Ftoken%3D{TOKEN}&v=1",
         "auth_url=http%3A%2F%2Flocalhost%3A8888%2F%3Ftoken%3D[redacted]&v=1"),
        (f"twice: %3Ftoken%253D{TOKEN}", "twice: %3Ftoken%253D[redacted]"),
        (f'{{"Authorization": "token {TOKEN}"}}', '{"Authorization": "token [redacted]"}'),
        (f"Authorization: Bearer {TOKEN}", "Authorization: Bearer [redacted]"),
        ("no secret here: 200 GET /api (127.0.0.1)", "no secret here: 200 GET /api (127.0.0.1)"),
    ],
    ids=["query", "query-then-more", "url-encoded-auth-url", "double-encoded", "json-header", "bearer",
         "clean"],
)
def test_redact_hides_token_parameters_and_authorization_values(line: str, expected: str):
    assert redact_log.redact(line) == expected


def test_redact_hides_the_known_secret_anywhere():
    assert redact_log.redact(f"odd place {TOKEN}!", [TOKEN]) == "odd place [redacted]!"


def _logger_with_filter(token_file: Path | None) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(redact_log.RedactSecrets(str(token_file) if token_file else None))
    logger = logging.getLogger(f"forja-test-{id(out)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return logger, out


def test_the_filter_redacts_formatted_arguments(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    logger, out = _logger_with_filter(token_file)
    logger.info("%d %s %s", 302, "GET", f"/?token={TOKEN}")
    logger.warning("the token %s leaked bare", TOKEN)
    assert out.getvalue() == "INFO 302 GET /?token=[redacted]\nWARNING the token [redacted] leaked bare\n"


def test_the_filter_redacts_tracebacks(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    logger, out = _logger_with_filter(token_file)
    try:
        raise ConnectionRefusedError(f"ws://localhost:9999/http_over_websocket?auth=%3Ftoken%3D{TOKEN}")
    except ConnectionRefusedError:
        logger.exception("Couldn't attach auth cookies")
    text = out.getvalue()
    assert "Traceback" in text and "ConnectionRefusedError" in text
    assert TOKEN not in text


def test_the_filter_reads_the_token_file_named_by_the_environment(tmp_path: Path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    monkeypatch.setenv("JUPYTER_TOKEN_FILE", str(token_file))
    logger, out = _logger_with_filter(None)
    logger.error("bare %s", TOKEN)
    assert out.getvalue() == "ERROR bare [redacted]\n"


def test_the_filter_survives_a_missing_token_file(tmp_path: Path):
    logger, out = _logger_with_filter(tmp_path / "absent")
    logger.info("GET /?token=%s", TOKEN)
    assert out.getvalue() == "INFO GET /?token=[redacted]\n"


def test_the_module_needs_only_the_standard_library():
    """It is imported by the notebook server inside the role's venv, which has no forja."""
    source = (ROLE / "files" / "forja_redact_log.py").read_text()
    imports = {line.split()[1].split(".")[0] for line in source.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports <= set(sys.stdlib_module_names) | {"__future__"}
