"""HTTP front end: routes requests by the discovery document's paths, checks auth and schema.

The order of checks follows what a client sees from Google: an unknown URL is a 404, a missing
or bad bearer token a 401, an unimplemented method a 501, then query parameters and the body
are validated, then the method runs. Every answer is JSON in Google's shapes.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, parse_qs, unquote

from ..emulator_http import LISTEN_BACKLOG, EmulatorServer, JsonHandler
from ..http_limits import BeyondLimits, BodyRefused, parse_json
from . import billing, oslogin, resource_manager, schema, service_usage
from .api import Call
from .auth import COMPUTE_AUDIENCE, BearerRefused, TokenError
from .errors import ApiError
from .fields import parse_fields, project
from .project_settings import ProjectSettings

if TYPE_CHECKING:
    from .emulator import ComputeEmulator

API_PREFIX = "/compute/v1/"
TOKEN_PATH = "/token"
#: The emulator's own control path (not Google's): POST a `Faults.add` keyword set, DELETE clears
#: them. It lets a drill make a zone run out while another process (the sandbox service) serves.
FAULTS_PATH = "/emulator/v1/faults"
#: The emulator's control path for one project's settings (not Google's): PUT
#: `ComputeEmulator.configure_project`'s keywords (plus `"new": true` for `new_project` first), GET
#: them back. It lets a drill against the sandbox service (another process) make a check fail.
PROJECTS_PATH = "/emulator/v1/projects/"
#: The emulator's control path for the capacity advisor's scores (not Google's): PUT
#: `ComputeEmulator.set_advice`'s keywords as JSON (answers the project's advice settings), DELETE
#: clears every score. It lets a drill against the sandbox service rank its zones.
ADVICE_PATH = "/emulator/v1/advice"
#: Google APIs other than Compute served under the same origin, each under its own prefix
#: (`/oslogin/v1/` for `https://oslogin.googleapis.com/v1/`, ...): their PREFIX, AUDIENCE,
#: scopes_for(http_method) and handle(store, http_method, path, query, body, principal).
OTHER_APIS = (oslogin, service_usage, resource_manager, billing)
_REALM = "https://accounts.google.com/"
_CREDENTIAL_HINT = (
    "Expected OAuth 2 access token, login cookie or other valid authentication credential. "
    "See https://developers.google.com/identity/sign-in/web/devconsole-project."
)


class Router:
    """Matches `projects/p/zones/z/instances/i` to a discovery method and its path parameters."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str, int], list[tuple[int, list[str], schema.Method]]] = {}
        for method in schema.methods().values():
            segments = method.flat_path.split("/")
            literals = sum(1 for s in segments if not s.startswith("{"))
            key = (method.http_method, len(segments))
            self._routes.setdefault(key, []).append((literals, segments, method))
        for routes in self._routes.values():
            routes.sort(key=lambda route: -route[0])

    def match(self, http_method: str, path: str) -> tuple[schema.Method, dict[str, str]] | None:
        parts = [unquote(p) for p in path.split("/")]
        for _literals, segments, method in self._routes.get((http_method, len(parts)), []):
            params: dict[str, str] = {}
            for segment, part in zip(segments, parts, strict=True):
                if segment.startswith("{"):
                    if not part:
                        break
                    params[segment[1:-1]] = part
                elif segment != part:
                    break
            else:
                return method, params
        return None


@functools.lru_cache(maxsize=1)
def router() -> Router:
    """One routing table per process: it only depends on the (pinned) discovery document."""
    return Router()


class EmulatorHTTPServer(EmulatorServer):
    """The Compute emulator's server: its handler, the emulator it serves and the routing table."""

    thread_name = "compute-emulator"

    def __init__(
        self, address: tuple[str, int], emulator: ComputeEmulator, listen_backlog: int = LISTEN_BACKLOG
    ) -> None:
        self.emulator = emulator
        self.router = router()
        self.request_queue_size = listen_backlog  # read by server_activate() inside __init__
        super().__init__(address, _Handler)


class RequestLog:
    """Counters and the recent request list that tests assert on."""

    def __init__(self, keep: int = 20000) -> None:
        self.lock = threading.Lock()
        self.token_requests = 0
        self.requests = 0
        self.by_method: dict[str, int] = {}
        self.recent: deque[tuple[str, str, dict[str, list[str]], Any]] = deque(maxlen=keep)

    def reset(self) -> None:
        with self.lock:
            self.token_requests = 0
            self.requests = 0
            self.by_method.clear()
            self.recent.clear()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "token_requests": self.token_requests,
                "requests": self.requests,
                "by_method": dict(self.by_method),
            }


class _Handler(JsonHandler):
    server_version = "forja-compute-emulator/1"
    server: EmulatorHTTPServer

    def route(self, verb: str, url: SplitResult, body: bytes) -> tuple[int, Any]:
        if url.path == TOKEN_PATH and verb == "POST":
            return self._token(body)
        if url.path == FAULTS_PATH and verb in ("POST", "DELETE"):
            return self._faults(verb, body)
        if url.path == ADVICE_PATH and verb in ("PUT", "DELETE"):
            return self._advice(verb, body)
        if url.path.startswith(API_PREFIX):
            return self._api(verb, url.path[len(API_PREFIX) :], url.query, body)
        if url.path.startswith(PROJECTS_PATH) and verb in ("GET", "PUT"):
            return self._project_settings(verb, unquote(url.path[len(PROJECTS_PATH) :]), body)
        for api in OTHER_APIS:
            if url.path.startswith(api.PREFIX):
                return self._other_api(api, verb, url.path[len(api.PREFIX) :], url.query, body)
        raise ApiError(404, f"The requested URL {url.path} was not found on this server.", "notFound")

    def refused(self, refused: BodyRefused) -> ApiError:
        return ApiError(refused.status, refused.message, "badRequest")

    def internal(self, exc: Exception) -> ApiError:
        return ApiError(500, f"Emulator error: {type(exc).__name__}: {exc}")

    def _faults(self, http_method: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """Add one fault rule (the body: `Faults.add`'s keywords), or clear them all."""
        faults = self.server.emulator.faults
        if http_method == "DELETE":
            faults.clear()
            return 200, {}
        try:
            rule = parse_json(raw or b"{}")
            if not isinstance(rule, dict):
                raise TypeError(f"the body must be an object of keywords, not a {type(rule).__name__}")
            fault = faults.add(**rule)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, f"Not a fault rule: {exc}", "badRequest") from None
        return 200, {"method": fault.method, "zone": fault.zone, "times": fault.times}

    def _advice(self, http_method: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """Set one zone's advice scores (the body: `set_advice`'s keywords), or clear them all."""
        emulator = self.server.emulator
        if http_method == "DELETE":
            emulator.advice.clear()
            return 200, {}
        try:
            keywords = parse_json(raw or b"{}")
            if not isinstance(keywords, dict):
                raise TypeError(f"the body must be an object of keywords, not a {type(keywords).__name__}")
            return 200, emulator.set_advice(**keywords)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, f"Not an advice setting: {exc}", "badRequest") from None

    def _project_settings(self, http_method: str, project: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        """Configure one project (the body: `configure_project`'s keywords, `"new": true` to start
        from `new_project`), or read its settings back."""
        emulator = self.server.emulator
        if not project or "/" in project:
            raise ApiError(404, f"The requested URL {PROJECTS_PATH}{project} was not found on this server.",
                           "notFound")
        if http_method == "PUT":
            try:
                keywords = parse_json(raw or b"{}")
                if not isinstance(keywords, dict):
                    kind = type(keywords).__name__
                    raise TypeError(f"the body must be an object of keywords, not a {kind}")
                new = keywords.pop("new", False)
                if not isinstance(new, bool):
                    raise TypeError(f"new: true or false, not {new!r}")
                if new:
                    ProjectSettings().update(**keywords)  # checked before new_project changes anything
                    emulator.new_project(project)
                emulator.configure_project(project, **keywords)
            except (ValueError, TypeError) as exc:
                raise ApiError(400, f"Not a project setting: {exc}", "badRequest") from None
        return 200, emulator.project_settings(project)

    def _token(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        emulator = self.server.emulator
        with emulator.log.lock:
            emulator.log.token_requests += 1
        form = {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        try:
            for fault in emulator.faults.take("token"):
                if fault.status:
                    raise TokenError("internal_failure", "Injected fault", fault.status)
            return 200, emulator.store.keyring.exchange(form, emulator.token_uri)
        except TokenError as exc:
            return exc.status, exc.body()

    def _api(self, http_method: str, path: str, query_string: str, raw: bytes) -> tuple[int, Any]:
        emulator = self.server.emulator
        query = parse_qs(query_string, keep_blank_values=True)
        routed = self.server.router.match(http_method, path)
        method_id = routed[0].id if routed else f"unknown:{http_method} {path}"
        body: Any = None
        if raw:
            try:
                body = parse_json(raw)
            except BeyondLimits as exc:
                raise ApiError(400, f"Invalid JSON payload received. {exc}.", "parseError") from None
            except ValueError:
                body = raw.decode("utf-8", "replace")
        with emulator.log.lock:
            emulator.log.requests += 1
            emulator.log.by_method[method_id] = emulator.log.by_method.get(method_id, 0) + 1
            emulator.log.recent.append((method_id, path, query, body))
        if routed is None:
            raise ApiError(
                404, f"The requested URL {API_PREFIX}{path} was not found on this server.", "notFound"
            )
        method, params = routed
        principal = self._authenticate(method)
        if not emulator.api.implements(method.id):
            raise ApiError(501, f"The emulator does not implement {method.id}.", "notImplemented")
        parsed_query = schema.parse_query(method, query)
        if method.request_schema is not None:
            if isinstance(body, str):
                raise ApiError(400, "Invalid JSON payload received. The body is not JSON.", "parseError")
            schema.validate_body(method, body if body is not None else {})
        selection = parse_fields(parsed_query["fields"]) if parsed_query.get("fields") else None
        result = emulator.api.dispatch(Call(method, params, parsed_query, body, principal))
        if selection is not None:
            result = project(json.loads(result) if isinstance(result, bytes) else result, selection)
        return 200, result

    def _other_api(
        self, api: Any, http_method: str, path: str, query_string: str, raw: bytes
    ) -> tuple[int, Any]:
        """A call of one of the OTHER_APIS (OS Login, Service Usage, Resource Manager, Cloud Billing)."""
        emulator = self.server.emulator
        try:
            body = parse_json(raw) if raw else None
        except ValueError:
            raise ApiError(400, "The body is not JSON.", "parseError") from None
        query = parse_qs(query_string, keep_blank_values=True)
        # Logged as `<api> <HTTP method>` (`cloudresourcemanager/v3 GET`) with the path after the
        # prefix: which URL a client built is what tests of these APIs check.
        method_id = f"{api.PREFIX.strip('/')} {http_method}"
        with emulator.log.lock:
            emulator.log.requests += 1
            emulator.log.by_method[method_id] = emulator.log.by_method.get(method_id, 0) + 1
            emulator.log.recent.append((method_id, path, query, body))
        principal = self._authenticate(api.scopes_for(http_method), api.AUDIENCE)
        return 200, api.handle(emulator.store, http_method, path, query, body, principal)

    def _authenticate(self, method: schema.Method | frozenset[str], audience: str = COMPUTE_AUDIENCE) -> str:
        """The caller's service account, from an issued access token or a self-signed JWT.

        `method`: the Compute method called, or the scopes that allow a call of another API
        (OS Login, Service Usage, ...), whose self-signed JWTs name that API's `audience`.
        """
        emulator = self.server.emulator
        authorization = self.headers.get("Authorization")
        if not authorization:
            raise ApiError(
                401,
                "Request is missing required authentication credential. " + _CREDENTIAL_HINT,
                "required",
                item_message="Login Required.",
                location="Authorization",
                headers={"WWW-Authenticate": f'Bearer realm="{_REALM}"'},
            )
        audiences = (audience, audience.rstrip("/"), emulator.url + "/", emulator.url)
        scopes = method if isinstance(method, frozenset) else method.scopes
        try:
            return emulator.store.keyring.authenticate(authorization, audiences, scopes)
        except BearerRefused as refused:
            if refused.status == 403:
                raise ApiError(
                    403, refused.why, "insufficientPermissions", status="PERMISSION_DENIED",
                    headers={"WWW-Authenticate": f'Bearer realm="{_REALM}", error="insufficient_scope"'},
                ) from None  # fmt: skip
            # Google's body says no more than this; the emulator's reason rides in the header.
            reason = " ".join(refused.why.replace('"', "'").split())  # one line, no quotes
            raise ApiError(
                401,
                "Request had invalid authentication credentials. " + _CREDENTIAL_HINT,
                "authError",
                item_message="Invalid Credentials",
                location="Authorization",
                headers={
                    "WWW-Authenticate": (
                        f'Bearer realm="{_REALM}", error="invalid_token", error_description="{reason}"'
                    )
                },
            ) from None
