"""The dashboard's server: Starlette on uvicorn, on 127.0.0.1 only, behind a token as Jupyter's is.

Why these: Starlette is a small, well-kept ASGI toolkit (routing, static files, responses) and
uvicorn its usual server; neither needs more than this page asks. The page is static (HTML, JS, CSS
and the vendored uPlot under ``static/``); it reads four JSON endpoints:

- ``/api/runs``: the history's runs with their status, cost (forja.cost.run: settled once ended, so far
  before), preemptions, zone moves;
- ``/api/runs/{id}``: one run: its cost part by part, its history events, its summary, its final plots;
- ``/api/live``: every serving run's live metrics (`forja.live.samples`, through the tunnel), collected here
  once a second into a series per run, so a chart survives a reload of the page;
- ``/api/vm``: the VMs' state and spend (`forja.cost_report.cost`), read at most every 30 s (it asks
  the cloud).

The token: random per start unless given (``FORJA_UI_TOKEN`` or ``--token-file``, never on the
command line, where ``ps`` shows it), shown once in the URL `forja ui` prints. The page keeps it in
the tab's sessionStorage and sends it as a header (see :class:`TokenGate`); an /api request without
it gets 403. There is no cookie and no redirect. uvicorn's access log is off, so no log line ever
holds it. The Host header must be 127.0.0.1 or localhost (a web page elsewhere cannot rebind a name
to this port), and the page may not be framed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from forja import cost_report, errors, live
from forja.format import plain
from forja.ui import DEFAULT_PORT, views
from trainer import finite, run_folder

if TYPE_CHECKING:
    from forja.session import Session

#: Where the dashboard listens: the loopback alone, always.
BIND = "127.0.0.1"
#: Environment variable that gives the token instead of a random one.
TOKEN_ENV = "FORJA_UI_TOKEN"
STATIC = Path(__file__).with_name("static")
#: Points kept per run and series (an hour at one a second).
POINTS = 3600
#: Seconds between two readings of the VMs (each asks the cloud through the inventory).
VM_EVERY_S = 30.0
HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data: blob:; "
    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}


class Dashboard:
    """What the page shows, read from a session: the history, the live series, the VMs (cached)."""

    def __init__(
        self, session: Session, metrics_urls: Sequence[str] | None = None, interval_s: float = 1.0
    ) -> None:
        self.session = session
        self.metrics_urls = list(metrics_urls) if metrics_urls else None
        self.interval_s = interval_s
        self.series: dict[str, deque[dict[str, Any]]] = {}
        self.latest: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._vm: tuple[float, dict[str, Any], list[dict[str, Any]]] | None = None
        self._costs: dict[tuple[str, str | None, str], Any] = {}

    # -- live metrics --------------------------------------------------------------------------
    def poll_live(self) -> None:
        """One reading of every serving run, appended to its series."""
        samples = live.samples(urls=self.metrics_urls, timeout=min(2.0, max(0.5, self.interval_s)))
        with self._lock:
            for sample in samples:
                data = sample.to_dict()
                gpus = [g["utilization"] for g in data["gpus"] if g.get("utilization") is not None]
                point = {"t": sample.scraped_at, "step": sample.step, "loss": sample.loss,
                         "samples_per_second": sample.samples_per_second, "cost_usd": sample.cost_usd,
                         "cpu": sample.cpu_utilization,
                         "gpu": sum(gpus) / len(gpus) if gpus else None}  # fmt: skip
                key = sample.run or sample.url
                self.series.setdefault(key, deque(maxlen=POINTS)).append(point)
                self.latest[key] = {**data, "serving": True, "fraction": sample.fraction_done}
            serving = {s.run or s.url for s in samples}
            for key in self.latest:
                if key not in serving:
                    self.latest[key]["serving"] = False

    def live(self, since: float = 0.0) -> dict[str, Any]:
        """The newest reading of each run (with its figures for people) and its points after `since`."""
        now = time.time()
        with self._lock:
            return {"now": now, "runs": {
                key: {"latest": {**self.latest[key], "shown": views.live(self.latest[key], now)},
                      "points": [p for p in points if p["t"] > since]}
                for key, points in self.series.items()
            }}  # fmt: skip

    # -- the VMs ------------------------------------------------------------------------------
    def vm(self, fresh: bool = False) -> dict[str, Any]:
        """The VMs' state and spend (`forja.cost_report.cost` of the inventory), at most every VM_EVERY_S."""
        if not fresh and self._vm is not None and time.monotonic() - self._vm[0] < VM_EVERY_S:
            return self._vm[1]
        instances: list[dict[str, Any]] = []
        if not self.session.inventory:
            report: dict[str, Any] = {"error": "no inventory named (forja -i ... ui, or FORJA_INVENTORY): "
                                               "the VM's state and spend are not known"}
        else:
            try:
                instances = self.session.instances_if_named()
                report = cost_report.cost(self.session, instances).as_dict()
                for line in report["instances"]:
                    line["shown"] = views.vm(line)
            except errors.ForjaError as exc:
                report = {"error": exc.message}
        self._vm = (time.monotonic(), report, instances)
        return report

    def instances(self) -> list[dict[str, Any]]:
        if self._vm is None:
            self.vm()
        assert self._vm is not None
        return self._vm[2]

    # -- the history --------------------------------------------------------------------------
    def _cost(self, record: Any) -> Any:
        """The run's cost (forja.cost.run), kept once the run has ended; an error is its message."""
        key = (record.run_id, record.ended_at, record.status)
        if key in self._costs:
            return self._costs[key]
        try:
            found: Any = cost_report.run_cost(self.session, record.run_id, self.instances())
        except errors.ForjaError as exc:
            found = exc.message
        if record.ended_at:
            self._costs[key] = found
        return found

    def runs(self) -> list[dict[str, Any]]:
        rows = []
        for record in self.session.history.list(limit=100):
            cost = self._cost(record)
            # An ended run: the cost settled in the history (forja.cost_report.settle), as every view
            # shows it; a run going on: its cost so far by the same function (forja.cost.run).
            settled = record.ended_at is not None and record.cost_usd is not None
            usd = record.cost_usd if settled or isinstance(cost, str) else cost.cost_usd
            events = self.session.history.events(record.run_id)
            rows.append({
                **plain(record),
                "cost_usd": usd,
                "shown": views.run_row(record, usd),
                "zone_moves": sum(1 for e in events if e.kind == "zone_moved"),
                "preemptions": max(record.preemptions, sum(1 for e in events if e.kind == "preempted")),
            })  # fmt: skip
        return rows

    def run(self, run_id: str) -> dict[str, Any]:
        from forja.cost.run import RunFiles

        record = self.session.history.get(run_id)
        cost = self._cost(record)
        files = RunFiles.read(record.artifact_dir)
        return {
            "record": plain(record),
            "events": [{**plain(e), "shown": views.event(e)} for e in self.session.history.events(run_id)],
            "cost": cost if isinstance(cost, str) else {**plain(cost), "shown": views.cost(cost)},
            "summary": files.summary,
            "plots": [p.name for p in self.plots(record)],
        }

    def sweeps(self) -> list[dict[str, Any]]:
        """The sweeps kept here (forja.sweep.status: the studies only, no host asked), each trial a row."""
        from forja import sweep

        return [{**plain(report), "shown": views.sweep_rows(report)} for report in sweep.status(self.session)]

    def plots(self, record: Any) -> list[Path]:
        """The run's final plots, as fetched (its artifact folder's plots/*.png)."""
        folder = Path(record.artifact_dir) / run_folder.PLOTS_DIR if record.artifact_dir else None
        return sorted(folder.glob("*.png")) if folder is not None and folder.is_dir() else []


class FiniteJSON(JSONResponse):
    """JSON whose NaN and Inf figures are null plus a ``nonfinite`` flag (trainer.finite), as in the
    run's own files: Starlette's JSONResponse refuses them, so one run reporting +Inf (an fp16
    overflow) made /api/live a 500 for every run, and a NaN summary its detail page."""

    def render(self, content: Any) -> bytes:
        return finite.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class TokenGate:
    """Every request for data needs the token, in an ``Authorization: token T`` header.

    The page and its static files hold no data and are served to anyone who reaches 127.0.0.1: the
    page takes the token from the URL `forja ui` printed, keeps it in the tab's sessionStorage (only
    this origin, port included, can read it) and sends it as that header. There is no cookie: a
    browser sends cookies to every port of 127.0.0.1, so Jupyter through the tunnel, or any other
    local server, would have received the token (it did, with the token itself as the cookie); and
    with no redirect, no crafted address (``//evil.example/?token=T``) can send the browser away.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def valid(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response: Response | None = None
        if request.url.path.startswith("/api/"):
            header = request.headers.get("authorization", "")
            given = header[6:] if header.lower().startswith("token ") else None
            if not self.valid(given):
                response = PlainTextResponse(
                    "forja ui needs its token: open the URL `forja ui` printed (it has ?token=...)",
                    status_code=403,
                )

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.setdefault("headers", [])
                headers.extend((k.encode(), v.encode()) for k, v in HEADERS.items())
            await send(message)

        if response is not None:
            await response(scope, receive, with_headers)
        else:
            await self.app(scope, receive, with_headers)


def make_app(board: Dashboard, token: str, *, collect: bool = True) -> Starlette:
    """The Starlette app; `collect` runs the live poller while the app runs (off in tests of routes)."""

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def runs(request: Request) -> Response:
        return FiniteJSON({"runs": await asyncio.to_thread(board.runs)})

    async def run(request: Request) -> Response:
        try:
            return FiniteJSON(await asyncio.to_thread(board.run, request.path_params["run_id"]))
        except errors.RunNotFound as exc:
            return FiniteJSON({"error": exc.message}, status_code=404)

    async def plot(request: Request) -> Response:
        try:
            record = board.session.history.get(request.path_params["run_id"])
        except errors.RunNotFound as exc:
            return FiniteJSON({"error": exc.message}, status_code=404)
        by_name = {p.name: p for p in board.plots(record)}  # only files listed: no path from the URL
        found = by_name.get(request.path_params["name"])
        if found is None:
            return FiniteJSON({"error": "no such plot"}, status_code=404)
        return FileResponse(found)

    async def live(request: Request) -> Response:
        try:
            since = float(request.query_params.get("since", "0"))
        except ValueError:
            since = 0.0
        return FiniteJSON(board.live(since))

    async def vm(request: Request) -> Response:
        return FiniteJSON(await asyncio.to_thread(board.vm))

    async def sweeps(request: Request) -> Response:
        return FiniteJSON({"sweeps": await asyncio.to_thread(board.sweeps)})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(_collect(board)) if collect else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    routes = [
        Route("/", index),
        Route("/api/runs", runs),
        Route("/api/runs/{run_id}", run),
        Route("/api/runs/{run_id}/plots/{name}", plot),
        Route("/api/live", live),
        Route("/api/vm", vm),
        Route("/api/sweeps", sweeps),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=[BIND, "localhost"]),
        Middleware(TokenGate, token=token),
    ]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


async def _collect(board: Dashboard) -> None:
    """Read the live endpoints every interval while the server runs (in a thread: requests blocks)."""
    while True:
        with contextlib.suppress(Exception):  # a reading that fails is the next one's to try
            await asyncio.to_thread(board.poll_live)
        await asyncio.sleep(board.interval_s)


def listen(port: int) -> socket.socket:
    """A socket on 127.0.0.1:`port` (0: any free one); a port in use is an error naming --port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((BIND, port))
    except OSError as exc:
        sock.close()
        raise errors.ConfigError("--port", f"{BIND}:{port} is taken ({exc.strerror}); give another "
                                 "--port, or 0 for any free one") from exc  # fmt: skip
    sock.listen(64)
    return sock


def serve(
    session: Session,
    *,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    metrics_urls: Sequence[str] | None = None,
    interval_s: float = 1.0,
    say: Callable[[str], None] = print,
) -> None:
    """Serve the dashboard until interrupted (Ctrl-C); `say` gets the one URL with the token."""
    sock = listen(port)
    token = token or os.environ.get(TOKEN_ENV, "").strip() or secrets.token_urlsafe(24)
    board = Dashboard(session, metrics_urls, interval_s)
    config = uvicorn.Config(make_app(board, token), log_level="warning", access_log=False, lifespan="on")
    say(f"forja ui: http://{BIND}:{sock.getsockname()[1]}/?token={token}")
    uvicorn.Server(config).run(sockets=[sock])
