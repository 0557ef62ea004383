"""A logging filter that keeps the Jupyter token (and other credentials) out of the server log.

Why it exists: notebook 6.5.7 logs ``302 GET /?token=<token>`` at INFO every time the
jupyter_http_over_ws extension replays Colab's auth URL, i.e. on every proxied request, and the
extension's tracebacks print the whole WebSocket URL with the auth URL in it (URL-encoded).
Those lines land in the journal. The forja jupyter_colab role installs this module into the
server's venv and attaches the filter to the console handler through ``NotebookApp.logging_config``.

The filter rewrites the final text of each record (message, traceback, stack), so it also covers
records that other libraries (tornado, the extension) send through the same handler.
Standard library only: it is imported by the notebook server, not by forja.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable

REDACTED = "[redacted]"

# token=..., token%3D... (once URL-encoded, as inside the auth URL) and token%253D... (twice).
_TOKEN_PARAM = re.compile(r"(token(?:=|%3D|%253D))[^&\s'\"#;,)]+", re.IGNORECASE)
# Authorization: token X / Bearer X, as a header line or a JSON/dict entry.
_AUTH_HEADER = re.compile(
    r"(authorization['\"]?\s*[:=]\s*['\"]?(?:token|bearer)\s+)[^\s'\",}]+", re.IGNORECASE
)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with token parameters, Authorization values and each known secret replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    text = _TOKEN_PARAM.sub(lambda m: m.group(1) + REDACTED, text)
    return _AUTH_HEADER.sub(lambda m: m.group(1) + REDACTED, text)


def _read_secret(path: str | None) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""


class RedactSecrets(logging.Filter):
    """Redact the token from every record passing through the handler it is attached to.

    The token itself is read once from ``token_file`` (default: ``$JUPYTER_TOKEN_FILE``, the file
    the server reads its token from), so even a token printed outside a ``token=`` parameter is
    caught; the patterns catch tokens the filter cannot know (a wrong token a client sent).
    """

    def __init__(self, token_file: str | None = None) -> None:
        super().__init__()
        secret = _read_secret(token_file or os.environ.get("JUPYTER_TOKEN_FILE"))
        self._secrets = (secret,) if secret else ()

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage(), self._secrets)
        record.args = ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self._secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self._secrets)
        return True
