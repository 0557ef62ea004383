"""A local stand-in for the Hugging Face Hub's HTTP endpoints that ``forja model push`` uses.

Why: the Hub cannot be reached from here, and a push must still be tested with the real
``huggingface_hub`` client (pinned in pyproject.toml), not with a fake of forja's own code. This
server answers the requests that client makes for ``whoami``, ``create_repo``, ``upload_folder``
(preupload, the LFS batch API, the upload PUT and verify, the NDJSON commit), ``repo_info`` and
``hf_hub_download`` (HEAD and GET of ``resolve``). The routes and payloads were read from
huggingface_hub 2.4.0's own code (``hf_api.py``, ``_commit_api.py``, ``lfs.py``, ``file_download.py``).

Tokens are configured per test (:class:`Token`): ``write`` may write the user's and its orgs'
namespaces, ``read`` may write nothing, ``fineGrained`` may write only the namespaces it lists.
A write without the right answers 403 with the Hub's ``{"error": ...}`` body and
``X-Error-Message`` header, so the client raises the same ``HfHubHTTPError`` it raises against
the Hub. Where this differs from the real Hub: forja_sandbox/README.md, "Hugging Face Hub stand-in".
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from forja_sandbox.serving import ServedOnThread

#: Suffixes the Hub's default .gitattributes sends through LFS (a subset), and its size threshold.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".onnx", ".msgpack", ".npz", ".zip")
LFS_THRESHOLD = 10 << 20
REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"


@dataclass(frozen=True)
class Token:
    """An access token's owner and rights, as the Hub's whoami-v2 describes them."""

    user: str
    role: str = "write"  # "read", "write" or "fineGrained"
    orgs: tuple[str, ...] = ()
    write_namespaces: tuple[str, ...] = ()  # fineGrained only: where it may create and commit

    def may_write(self, namespace: str) -> bool:
        if self.role == "write":
            return namespace in (self.user, *self.orgs)
        if self.role == "fineGrained":
            return namespace in self.write_namespaces
        return False

    def whoami(self) -> dict[str, Any]:
        access: dict[str, Any] = {"displayName": f"{self.user}-{self.role}", "role": self.role}
        if self.role == "fineGrained":
            access["fineGrained"] = {
                "canReadGatedRepos": False,
                "global": [],
                "scoped": [
                    {"entity": {"type": "user" if ns == self.user else "org", "name": ns},
                     "permissions": ["repo.content.read", "repo.write"]}
                    for ns in self.write_namespaces
                ],
            }  # fmt: skip
        return {
            "type": "user",
            "id": hashlib.sha1(self.user.encode()).hexdigest()[:24],
            "name": self.user,
            "fullname": self.user,
            "orgs": [{"type": "org", "name": org} for org in self.orgs],
            "auth": {"type": "access_token", "accessToken": access},
        }


@dataclass
class StoredFile:
    data: bytes
    lfs: bool

    @property
    def oid(self) -> str:
        """The preupload oid the client compares with its own: sha256 for LFS, git's blob sha1 else."""
        if self.lfs:
            return hashlib.sha256(self.data).hexdigest()
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: list[str] = field(default_factory=list)  # commit ids, oldest first
    files: dict[str, StoredFile] = field(default_factory=dict)  # the head of main

    @property
    def sha(self) -> str:
        return self.commits[-1] if self.commits else "0" * 40


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


class HubStandIn(ServedOnThread, ThreadingHTTPServer):
    """The server: ``with HubStandIn({"hf_w": Token("alice")}) as hub: HfApi(endpoint=hub.url)``."""

    thread_name = "hub-standin"

    def __init__(self, tokens: dict[str, Token], host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), _Handler)
        self.tokens = dict(tokens)
        self.repos: dict[str, Repo] = {}
        self.objects: dict[str, bytes] = {}  # LFS store by sha256
        self.uploads: dict[str, tuple[str, int]] = {}  # one-time upload signature -> (oid, size)
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status), for tests
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def files(self, repo_id: str) -> dict[str, bytes]:
        """The files at the head of a repo's main branch."""
        with self.lock:
            return {path: f.data for path, f in self.repos[repo_id].files.items()}

    # -- the Hub's rules ----------------------------------------------------------------------------

    def caller(self, headers: Any, required: bool = True) -> Token | None:
        auth = headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        found = self.tokens.get(token)
        if found is None and (required or token):
            raise HubError(401, "Invalid credentials in Authorization header")
        return found

    def repo_for(self, repo_id: str, who: Token | None, write: bool) -> Repo:
        repo = self.repos.get(repo_id)
        namespace = repo_id.split("/")[0]
        member = who is not None and namespace in (who.user, *who.orgs)
        visible = repo is not None and (not repo.private or member)
        if not visible:
            raise HubError(404, "Repository not found", "RepoNotFound")
        assert repo is not None
        if write and (who is None or not who.may_write(namespace)):
            raise HubError(403, f"You don't have the rights to push to {repo_id}: this token cannot write")
        return repo


class _Handler(BaseHTTPRequestHandler):
    server: HubStandIn
    protocol_version = "HTTP/1.1"
    _payload: bytes = b""

    def log_message(self, format: str, *args: Any) -> None:  # no request log (it would show paths only)
        return

    # -- plumbing -------------------------------------------------------------------------------------

    def _body(self) -> bytes:
        """The request's body, read once by _dispatch before any route runs (see there)."""
        return self._payload

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, payload: Any = None, headers: dict[str, str] | None = None,
              raw: bytes | None = None, head: bool = False) -> None:  # fmt: skip
        body = raw if raw is not None else (b"" if payload is None else json.dumps(payload).encode())
        # recorded before the answer goes out: a test reads the list as soon as its client has the answer
        self.server.requests.append((self.command, urlsplit(self.path).path, status))
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if raw is None else "application/octet-stream")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _dispatch(self) -> None:
        # Read the whole body first, also for a request refused at once: bytes left unread on a
        # kept-alive connection would be taken for the next request.
        self._payload = self._read_body()
        path = unquote(urlsplit(self.path).path)
        query = parse_qs(urlsplit(self.path).query)
        try:
            for method, pattern, handler in ROUTES:
                match = re.fullmatch(pattern, path)
                if method == self.command and match:
                    handler(self, query=query, **match.groupdict())
                    return
            raise HubError(404, f"no route {self.command} {path} in the stand-in")
        except HubError as exc:
            headers = {"X-Error-Message": exc.message}
            if exc.code:
                headers["X-Error-Code"] = exc.code
            self._send(exc.status, {"error": exc.message, **exc.extra}, headers, head=self.command == "HEAD")

    do_GET = do_POST = do_PUT = do_HEAD = _dispatch

    # -- routes ---------------------------------------------------------------------------------------

    def whoami(self, query: Any) -> None:
        who = self.server.caller(self.headers)
        assert who is not None
        self._send(200, who.whoami())

    def create_repo(self, query: Any) -> None:
        who = self.server.caller(self.headers)
        assert who is not None
        body = json.loads(self._body() or b"{}")
        namespace = body.get("organization") or who.user
        repo_id = f"{namespace}/{body['name']}"
        if body.get("type", "model") != "model":
            raise HubError(400, "the stand-in keeps model repos only")
        if not who.may_write(namespace):
            why = f'You don\'t have the rights to create a model under the namespace "{namespace}"'
            raise HubError(403, why)
        url = f"{self.server.url}/{repo_id}"
        with self.server.lock:
            if repo_id in self.server.repos:
                raise HubError(409, "You already created this model repo", url=url)  # the client reads it
            self.server.repos[repo_id] = Repo(repo_id, private=body.get("visibility") == "private")
        self._send(200, {"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def repo_info(self, query: Any, repo: str, revision: str = "main") -> None:
        who = self.server.caller(self.headers, required=False)
        found = self.server.repo_for(repo, who, write=False)
        self._revision(revision)
        self._send(200, {
            "id": repo, "modelId": repo, "sha": found.sha, "private": found.private,
            "siblings": [{"rfilename": name} for name in sorted(found.files)],
        })  # fmt: skip

    def preupload(self, query: Any, repo: str, revision: str) -> None:
        who = self.server.caller(self.headers)
        found = self.server.repo_for(repo, who, write=True)
        self._revision(revision)
        body = json.loads(self._body())
        answer = []
        for entry in body["files"]:
            sample = base64.b64decode(entry.get("sample", ""))
            lfs = entry["path"].endswith(LFS_SUFFIXES) or entry["size"] > LFS_THRESHOLD or b"\0" in sample
            existing = found.files.get(entry["path"])
            answer.append({"path": entry["path"], "uploadMode": "lfs" if lfs else "regular",
                           "shouldIgnore": False, "oid": existing.oid if existing else None})  # fmt: skip
        self._send(200, {"files": answer, "commitOid": found.sha})

    def lfs_batch(self, query: Any, repo: str) -> None:
        who = self.server.caller(self.headers)
        self.server.repo_for(repo, who, write=True)
        body = json.loads(self._body())
        if body.get("operation") != "upload" or "basic" not in body.get("transfers", ["basic"]):
            raise HubError(400, "the stand-in takes basic LFS uploads only")
        objects = []
        for obj in body["objects"]:
            oid, size = str(obj["oid"]), int(obj["size"])
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            with self.server.lock:
                stored = oid in self.server.objects
                if not stored:
                    signature = secrets.token_urlsafe(16)
                    self.server.uploads[signature] = (oid, size)
            if not stored:  # like a presigned URL: the PUT carries no token, the URL is the right
                entry["actions"] = {
                    "upload": {"href": f"{self.server.url}/lfs-upload/{oid}?sig={signature}"},
                    "verify": {"href": f"{self.server.url}/{repo}.git/info/lfs/objects/verify", "header": {}},
                }
            objects.append(entry)
        self._send(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def lfs_put(self, query: Any, oid: str) -> None:
        signature = (query.get("sig") or [""])[0]
        with self.server.lock:
            expected = self.server.uploads.pop(signature, None)
        if expected is None or expected[0] != oid:
            raise HubError(403, "upload URL not valid (unknown or used signature)")
        data = self._body()
        if len(data) != expected[1] or hashlib.sha256(data).hexdigest() != oid:
            raise HubError(400, f"uploaded bytes do not match oid {oid} and size {expected[1]}")
        with self.server.lock:
            self.server.objects[oid] = data
        self._send(200, raw=b"")

    def lfs_verify(self, query: Any, repo: str) -> None:
        who = self.server.caller(self.headers)
        self.server.repo_for(repo, who, write=True)
        body = json.loads(self._body())
        data = self.server.objects.get(str(body.get("oid")))
        if data is None or len(data) != int(body.get("size", -1)):
            raise HubError(404, f"object {body.get('oid')} was not uploaded")
        self._send(200, {})

    def commit(self, query: Any, repo: str, revision: str) -> None:
        who = self.server.caller(self.headers)
        found = self.server.repo_for(repo, who, write=True)
        self._revision(revision)
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "a commit starts with its header line")
        changes: dict[str, StoredFile | None] = {}
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                changes[value["path"]] = StoredFile(base64.b64decode(value["content"]), lfs=False)
            elif line["key"] == "lfsFile":
                data = self.server.objects.get(value["oid"])
                if data is None:
                    raise HubError(422, f"Your push was rejected: LFS object {value['oid']} is missing")
                changes[value["path"]] = StoredFile(data, lfs=True)
            elif line["key"] == "deletedFile":
                changes[value["path"]] = None
            else:
                raise HubError(400, f"the stand-in does not take {line['key']!r} operations")
        with self.server.lock:
            for path, stored in changes.items():
                if stored is None:
                    found.files.pop(path, None)
                else:
                    found.files[path] = stored
            sha = hashlib.sha1(json.dumps(lines).encode() + found.sha.encode()).hexdigest()
            found.commits.append(sha)
        url = f"{self.server.url}/{repo}/commit/{sha}"
        self._send(200, {"success": True, "commitOid": sha, "commitUrl": url, "pullRequestUrl": None})

    def resolve(self, query: Any, repo: str, revision: str, filename: str) -> None:
        who = self.server.caller(self.headers, required=False)
        found = self.server.repo_for(repo, who, write=False)
        self._revision(revision)
        stored = found.files.get(filename)
        if stored is None:
            raise HubError(404, f"{filename} is not in {repo}", "EntryNotFound")
        headers = {"X-Repo-Commit": found.sha, "ETag": f'"{stored.oid}"'}
        if stored.lfs:
            headers.update({"X-Linked-Etag": f'"{stored.oid}"', "X-Linked-Size": str(len(stored.data))})
        self._send(200, raw=stored.data, headers=headers, head=self.command == "HEAD")

    def _revision(self, revision: str) -> None:
        if unquote(revision) != "main":
            raise HubError(404, f"Revision {revision} not found (only main here)", "RevisionNotFound")


ROUTES: list[tuple[str, str, Any]] = [
    ("GET", r"/api/whoami-v2", _Handler.whoami),
    ("POST", r"/api/repos/create", _Handler.create_repo),
    ("GET", rf"/api/models/{REPO}", _Handler.repo_info),
    ("GET", rf"/api/models/{REPO}/revision/(?P<revision>[^/]+)", _Handler.repo_info),
    ("POST", rf"/api/models/{REPO}/preupload/(?P<revision>[^/]+)", _Handler.preupload),
    ("POST", rf"/api/models/{REPO}/commit/(?P<revision>[^/]+)", _Handler.commit),
    ("POST", rf"/{REPO}\.git/info/lfs/objects/batch", _Handler.lfs_batch),
    ("POST", rf"/{REPO}\.git/info/lfs/objects/verify", _Handler.lfs_verify),
    ("PUT", r"/lfs-upload/(?P<oid>[0-9a-f]{64})", _Handler.lfs_put),
    ("HEAD", rf"/{REPO}/resolve/(?P<revision>[^/]+)/(?P<filename>.+)", _Handler.resolve),
    ("GET", rf"/{REPO}/resolve/(?P<revision>[^/]+)/(?P<filename>.+)", _Handler.resolve),
]

