"""A client that talks to a Jupyter server the way Google Colab's frontend does.

There is no browser and no Colab in tests, so this module plays Colab's part: it runs one cell and
returns its stdout, over either of the two ways Colab connects to a "local runtime":

* ``run_via_http_over_ws``: the older path through the ``jupyter_http_over_ws`` extension. Every
  REST call travels as a JSON frame over one WebSocket, authenticated by an "auth URL" (the URL the
  user pasted, ``http://localhost:PORT/?token=T``) which the extension fetches to get login cookies;
  the kernel channel goes through the extension's ``proxied_ws`` WebSocket proxy.
* ``run_via_direct``: Colab's newer path: plain CORS requests to the Jupyter REST API and the kernel
  channel WebSocket, with the token in the URL and Colab's ``Origin``.

``base_url`` is always the URL *as the browser sees it* (``http://localhost:8888``): the extension
calls itself at the browser's Host, which is why the SSH tunnel must use the same port on both ends.
Refusals (403 at a handshake, 403 on a proxied request) raise ``ColabRefused`` carrying the HTTP
status, so callers and tests can tell "refused" from "broken".
"""

from __future__ import annotations

import base64
import datetime
import json
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import requests
import websocket

COLAB_ORIGIN = "https://colab.research.google.com"
# The extension reports HANDLER_VERSION 0.0.7 even in its 0.0.8 release and closes the socket
# (with an illegal close code) when a client asks for anything newer.
HTTP_OVER_WS_MIN_VERSION = "0.0.7"
DEFAULT_TIMEOUT_S = 60.0
CLEANUP_TIMEOUT_S = 10.0  # deleting the kernel still gets this long after the run timed out


class ColabError(RuntimeError):
    """The Colab-like session failed for a reason other than a clean refusal."""


class ColabRefused(ColabError):
    """The server refused the request: ``status`` is the HTTP status (403 for origin/token/host)."""

    def __init__(self, status: int, stage: str, detail: str = "") -> None:
        self.status = status
        self.stage = stage
        super().__init__(f"{stage}: HTTP {status}" + (f" ({detail})" if detail else ""))


class CellError(ColabError):
    """The cell ran and raised: carries the kernel's exception name and value."""

    def __init__(self, ename: str, evalue: str) -> None:
        self.ename = ename
        self.evalue = evalue
        super().__init__(f"the cell raised {ename}: {evalue}")


# --------------------------------------------------------------------------------------------------
# Public API


def run_via_http_over_ws(
    base_url: str,
    token: str | None,
    code: str,
    *,
    origin: str = COLAB_ORIGIN,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str:
    """Run ``code`` in a fresh kernel through ``/http_over_websocket`` and return its stdout.

    Mirrors Colab's legacy flow: open the proxy socket with the auth URL, ``POST /api/kernels``
    through it, open the kernel channel through ``proxied_ws``, execute, then delete the kernel.
    """
    deadline = time.monotonic() + timeout_s
    auth_url = _auth_url(base_url, token)
    query = {"min_version": HTTP_OVER_WS_MIN_VERSION, "jupyter_http_over_ws_auth_url": auth_url}
    proxy_url = _ws_url(base_url, "/http_over_websocket", query)
    with _open_ws(proxy_url, origin, deadline, "http_over_ws socket") as ws:
        proxy = _HttpOverWs(ws, deadline)
        kernel_id = _kernel_id(proxy.request("POST", "/api/kernels", {}))
        try:
            channel_url = _ws_url(
                base_url,
                f"/http_over_websocket/proxied_ws/api/kernels/{kernel_id}/channels",
                {"session_id": uuid.uuid4().hex, **query},
            )
            with _open_ws(channel_url, origin, deadline, "proxied kernel channel") as channel:
                return _execute(channel, code, deadline)
        finally:
            # Cleanup gets its own short budget and must not hide why the run failed.
            with suppress(ColabError, OSError, websocket.WebSocketException):
                cleanup = _HttpOverWs(ws, time.monotonic() + CLEANUP_TIMEOUT_S)
                cleanup.request("DELETE", f"/api/kernels/{kernel_id}")


def run_via_direct(
    base_url: str,
    token: str | None,
    code: str,
    *,
    origin: str = COLAB_ORIGIN,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str:
    """Run ``code`` in a fresh kernel over plain CORS requests and return its stdout.

    Mirrors Colab's newer flow: ``POST /api/kernels?token=`` with Colab's Origin, then the kernel
    channel WebSocket with the token in its URL, then ``DELETE`` the kernel.
    """
    deadline = time.monotonic() + timeout_s
    auth = {"token": token} if token else {}
    headers = {"Origin": origin}
    api = base_url.rstrip("/") + "/api/kernels"
    reply = requests.post(api, params=auth, headers=headers, json={}, timeout=_left(deadline))
    if reply.status_code != 201:
        raise ColabRefused(reply.status_code, "POST /api/kernels", reply.text[:200])
    kernel_id = _kernel_id(reply.content)
    try:
        channel_url = _ws_url(
            base_url, f"/api/kernels/{kernel_id}/channels", {"session_id": uuid.uuid4().hex, **auth}
        )
        with _open_ws(channel_url, origin, deadline, "kernel channel") as channel:
            return _execute(channel, code, deadline)
    finally:
        with suppress(requests.RequestException):  # cleanup must not hide the cause
            requests.delete(f"{api}/{kernel_id}", params=auth, headers=headers, timeout=CLEANUP_TIMEOUT_S)


# --------------------------------------------------------------------------------------------------
# The pieces


def _auth_url(base_url: str, token: str | None) -> str:
    """The URL Colab's user pastes; the extension fetches it to log in (so: no token, no cookies)."""
    root = base_url.rstrip("/") + "/"
    return f"{root}?{urllib.parse.urlencode({'token': token})}" if token else root


def _ws_url(base_url: str, path: str, query: dict[str, str]) -> str:
    parts = urllib.parse.urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urllib.parse.urlunsplit((scheme, parts.netloc, path, urllib.parse.urlencode(query), ""))


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ColabError("timed out waiting for the Jupyter server")
    return left


@contextmanager
def _open_ws(url: str, origin: str, deadline: float, what: str) -> Iterator[websocket.WebSocket]:
    """Open a WebSocket with a browser-like Origin; a refused upgrade becomes ``ColabRefused``."""
    try:
        ws = websocket.create_connection(url, origin=origin, timeout=_left(deadline))
    except websocket.WebSocketBadStatusException as exc:
        raise ColabRefused(exc.status_code, f"{what} handshake") from exc
    except (OSError, websocket.WebSocketException) as exc:
        raise ColabError(f"{what}: could not connect: {exc}") from exc
    try:
        yield ws
    finally:
        ws.close()


def _kernel_id(body: bytes) -> str:
    try:
        return str(json.loads(body)["id"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ColabError(f"unexpected reply to POST /api/kernels: {body[:200]!r}") from exc


class _HttpOverWs:
    """HTTP requests as JSON frames over the extension's socket; replies come back in chunks."""

    def __init__(self, ws: websocket.WebSocket, deadline: float) -> None:
        self._ws = ws
        self._deadline = deadline

    def request(self, method: str, path: str, body: Any = None) -> bytes:
        message_id = uuid.uuid4().hex
        frame: dict[str, Any] = {"message_id": message_id, "method": method, "path": path}
        if body is not None:
            frame["body_base64"] = base64.b64encode(json.dumps(body).encode()).decode()
        self._ws.send(json.dumps(frame))
        status, status_text, data = 0, "", b""
        while True:
            self._ws.settimeout(_left(self._deadline))
            reply = json.loads(self._ws.recv())
            if reply.get("message_id") != message_id:
                continue
            status = reply.get("status", status)
            status_text = reply.get("statusText", status_text)
            data += base64.b64decode(reply.get("data", ""))
            if reply.get("done"):
                break
        if status >= 400:
            detail = f"{status_text}; {data[:200].decode(errors='replace')}".strip("; ")
            raise ColabRefused(status, f"{method} {path} via http_over_ws", detail)
        return data


def _execute(channel: websocket.WebSocket, code: str, deadline: float) -> str:
    """Send one execute_request and gather stdout until the kernel reports idle for it.

    Waiting for ``status: idle`` with our msg_id as parent (not for the first execute_reply) is
    deliberate: a stray early execute_reply has been seen on a fresh kernel.
    """
    msg_id = uuid.uuid4().hex
    channel.send(json.dumps(_execute_request(msg_id, code)))
    stdout: list[str] = []
    error: tuple[str, str] | None = None
    while True:
        channel.settimeout(_left(deadline))
        raw = channel.recv()
        if not isinstance(raw, str):  # binary frames carry buffers, never text output
            continue
        msg = json.loads(raw)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind, content = msg.get("msg_type") or msg["header"]["msg_type"], msg.get("content", {})
        if kind == "stream" and content.get("name") == "stdout":
            stdout.append(content.get("text", ""))
        elif kind == "error":
            error = (content.get("ename", "?"), content.get("evalue", ""))
        elif kind == "status" and content.get("execution_state") == "idle":
            break
    if error:
        raise CellError(*error)
    return "".join(stdout)


def _execute_request(msg_id: str, code: str) -> dict[str, Any]:
    """A Jupyter messaging-protocol 5.3 execute_request for the shell channel."""
    return {
        "header": {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": "colab",
            "session": uuid.uuid4().hex,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "version": "5.3",
        },
        "parent_header": {},
        "metadata": {},
        "channel": "shell",
        "content": {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
        "buffers": [],
    }
