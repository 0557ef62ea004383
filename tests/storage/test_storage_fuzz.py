"""At least 200 malformed requests against the sandbox's Cloud Storage (gcp-storage-emulator and its
shim, forja_sandbox/storage_emulator.py): no 500, no hung handler, nothing created or changed, and it
still serves afterwards. The limits: forja_sandbox/http_limits.py and forja_sandbox/README.md ("Cloud
Storage").

Before the shim checked requests on the wire: a Content-Length longer than the body, or negative, or
a request line that never ended hung the emulator (it serves one request at a time, so everyone
else waited too), as did a connection that sent nothing; 110 requests (a non-JSON or deep JSON body,
a bad multipart, Content-Length abc or 10^12, ifGenerationMatch=abc, a name with NUL) dropped the
connection instead of a 400; a bucket named 5 was half-created and broke every later bucket list;
names with a newline or invalid UTF-8 became objects; a resumable chunk with a Content-Range it could
not parse was taken for the whole object; object patches ignored ifGenerationMatch.

Every request that gets past validation meets a precondition that fails: bucket inserts name a bucket
that exists (409), uploads and patches carry ``ifGenerationMatch=0`` for an object that exists (412).
So 409 or 412 means "taken as valid", 400 "refused as malformed".
"""

from __future__ import annotations

import gzip
import json
import random
import socket
import time
import urllib.request
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import pytest
from fuzz_http import Case, answered, header_cases, json_bodies, request, send

from forja_sandbox.storage_emulator import Refused, StorageEmulator, precondition_holds

BUCKET = "forja-fuzz"
TAKEN = "fuzz/taken"  # exists before the fuzz: ifGenerationMatch=0 on it fails (412)
CONTENT = b"the taken object's bytes"
BUCKET_BODY = {
    "name": BUCKET, "location": "EUROPE-WEST4", "storageClass": "STANDARD", "labels": {"team": "ml"},
    "iamConfiguration": {"uniformBucketLevelAccess": {"enabled": True}},
    "lifecycle": {"rule": [{"action": {"type": "Delete"}, "condition": {"age": 7}}]},
}  # fmt: skip
OBJECT_BODY = {
    "name": TAKEN, "contentType": "text/plain", "cacheControl": "no-cache", "contentLanguage": "en",
    "customTime": "2026-01-01T00:00:00Z", "metadata": {"sha256": "ab" * 32, "step": "10"},
    "acl": [{"entity": "allUsers", "role": "READER"}],
}  # fmt: skip
BOUNDARY = "fuzz_boundary"
JSON = {"Content-Type": "application/json"}
UPLOAD = f"/upload/storage/v1/b/{BUCKET}/o"
TAKEN_QUERY = f"name={quote(TAKEN, safe='')}&ifGenerationMatch=0"
OBJECT = f"/storage/v1/b/{BUCKET}/o/{quote(TAKEN, safe='')}"
#: Framing cases that each wait out the 3 s read timeout: sent once (to the bucket insert), not per route.
SLOW = ("length longer than body", "not http")


def multipart(meta: bytes, data: bytes = b"fuzz") -> bytes:
    """A multipart/related upload body: the object resource, then its bytes (what Google's clients send)."""
    head = f"--{BOUNDARY}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode()
    middle = f"\r\n--{BOUNDARY}\r\nContent-Type: text/plain\r\n\r\n".encode()
    return head + meta + middle + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def cases(session: str) -> list[Case]:
    """The requests; ``session`` is the path and query of a resumable session for TAKEN (its chunks)."""
    rng = random.Random(20261130)
    found: list[Case] = []
    insert = "/storage/v1/b?project=forja-sandbox"
    for label, body in json_bodies(rng, BUCKET_BODY):
        found.append(Case(f"bucket insert: {label}", request("POST", insert, body, JSON)))
    framing = header_cases("POST", insert, JSON, json.dumps(BUCKET_BODY).encode())
    found += [Case(f"bucket framing: {label}", raw) for label, raw in framing]
    for label, body in json_bodies(rng, OBJECT_BODY):
        found.append(Case(f"patch: {label}", request("PATCH", f"{OBJECT}?ifGenerationMatch=0", body, JSON)))
    multi = {"Content-Type": f"multipart/related; boundary={BOUNDARY}"}
    for label, meta in json_bodies(rng, OBJECT_BODY):
        path = f"{UPLOAD}?uploadType=multipart&{TAKEN_QUERY}"
        found.append(Case(f"multipart: {label}", request("POST", path, multipart(meta), multi)))
    for label, body in json_bodies(rng, OBJECT_BODY):
        path = f"{UPLOAD}?uploadType=resumable&{TAKEN_QUERY}"
        found.append(Case(f"resumable start: {label}", request("POST", path, body, JSON)))
    found += multipart_cases() + media_cases() + chunk_cases(session) + query_and_path_cases()
    return found


def multipart_cases() -> list[Case]:
    path = f"{UPLOAD}?uploadType=multipart&{TAKEN_QUERY}"
    meta = json.dumps(OBJECT_BODY).encode()
    bodies = {
        "no boundary": ({"Content-Type": "multipart/related"}, multipart(meta)),
        "other boundary": ({"Content-Type": "multipart/related; boundary=other"}, multipart(meta)),
        "one part": ({}, multipart(meta).split(b"\r\n--" + BOUNDARY.encode() + b"\r\n")[0]),
        "no parts": ({}, f"--{BOUNDARY}--\r\n".encode()),
        "junk": ({}, bytes(range(256)) * 4),
        "meta not json": ({}, multipart(b"\xff\xfe not json")),
        "meta a list": ({}, multipart(b"[]")),
        "three parts": ({}, multipart(meta, b"x\r\n--" + BOUNDARY.encode() + b"\r\n\r\nmore")),
    }
    typed = {"Content-Type": f"multipart/related; boundary={BOUNDARY}"}
    return [Case(f"multipart framing: {label}", request("POST", path, body, {**typed, **headers}))
            for label, (headers, body) in bodies.items()]  # fmt: skip


def media_cases() -> list[Case]:
    data = b"fuzz object bytes"
    media = f"{UPLOAD}?uploadType=media"
    framing = header_cases("POST", f"{media}&{TAKEN_QUERY}", {}, data)
    found = [Case(f"media framing: {label}", raw) for label, raw in framing if label not in SLOW]
    taken = f"name={quote(TAKEN, safe='')}"
    queries = {
        "no name": "", "empty name": "name=", "name 1100 bytes": "name=" + "n" * 1100,
        "name with a newline": "name=a%0Ab", "name with a carriage return": "name=a%0Db", "name .": "name=.",
        "name ..": "name=..", "name with NUL": "name=a%00b", "name ../escape": "name=../../escape",
        "name invalid utf-8": "name=%FF%FE", "ifGenerationMatch abc": f"{taken}&ifGenerationMatch=abc",
        "ifGenerationMatch -1": f"{taken}&ifGenerationMatch=-1",
        "ifGenerationMatch 1e3": f"{taken}&ifGenerationMatch=1e3",
        "ifGenerationMatch 2^64": f"{taken}&ifGenerationMatch={2**64}",
        "ifGenerationNotMatch empty": f"{TAKEN_QUERY}&ifGenerationNotMatch=",
        "ifMetagenerationMatch abc": f"{TAKEN_QUERY}&ifMetagenerationMatch=abc",
    }  # fmt: skip
    for label, query in queries.items():
        found.append(Case(f"media: {label}", request("POST", f"{media}&{query}", data)))
    bad_type = f"{UPLOAD}?uploadType=bogus&{TAKEN_QUERY}"
    found.append(Case("media: uploadType bogus", request("POST", bad_type, data)))
    found.append(Case("media: no uploadType", request("POST", f"{UPLOAD}?{TAKEN_QUERY}", data)))
    missing = f"/upload/storage/v1/b/no-such-bucket/o?uploadType=media&{TAKEN_QUERY}"
    found.append(Case("media: no such bucket", request("POST", missing, data)))
    gz = {"Content-Encoding": "gzip"}
    found.append(Case("media: gzip junk", request("POST", f"{media}&{TAKEN_QUERY}", data, gz)))
    found.append(Case("media: deflate junk", request("POST", f"{media}&{TAKEN_QUERY}", data,
                                                     {"Content-Encoding": "deflate"})))  # fmt: skip
    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MiB of zeros in 8 KiB: a JSON body may not expand so
    found.append(Case("bucket insert: gzip bomb", request("POST", "/storage/v1/b?project=forja-sandbox",
                                                          bomb, {**JSON, **gz})))  # fmt: skip
    found.append(Case("media: length 6 TiB", request("POST", f"{media}&{TAKEN_QUERY}", data,
                                                     length=str(6 << 40))))  # fmt: skip
    return found


def chunk_cases(session: str) -> list[Case]:
    """Resumable chunk PUTs to a live session for TAKEN, with a bad Content-Range."""
    chunk = b"0123456789"
    ranges = (
        "bytes", "bytes 0-9", "bytes 9-0/10", "bytes 0-9/5", "bytes 0-99/100", "bytes -1-9/10",
        "bytes abc-def/ghi", "bytes 0-9/10, 10-19/20", "bytes=0-9/10", "items 0-9/10", "bytes 0-9/-10",
        "bytes 10-19/20", f"bytes 0-{10**30}/{10**31}", "bytes */abc", "bytes 0-*/5", "bytes 5-9/10",
        "bytes 0-9/9", "", " ", "bytes 0-4/*", "\x00", "bytes 0-9/10 junk",
    )  # fmt: skip
    found = [Case(f"chunk Content-Range {value!r}", request("PUT", session, chunk, {"Content-Range": value}))
             for value in ranges]  # fmt: skip
    good = {"Content-Range": "bytes 0-9/10"}
    framing = header_cases("PUT", session, good, chunk)
    skip = (*SLOW, "length 10^12")  # the media upload's 10^12 already waits out its body
    found += [Case(f"chunk framing: {label}", raw) for label, raw in framing if label not in skip]
    bad_id = session.split("upload_id=")[0] + "upload_id=nonesuch"
    found.append(Case("chunk: unknown upload_id", request("PUT", bad_id, chunk, good)))
    empty_id = f"{UPLOAD}?uploadType=resumable&upload_id="
    found.append(Case("chunk: empty upload_id", request("PUT", empty_id, chunk)))
    return found


#: Query parameters GCS takes as integers, given something else: 400 wherever they come.
INTEGERS = ("ifGenerationMatch=abc", "maxResults=-1", "maxResults=abc", f"maxResults={2**70}", "generation=x")


def query_and_path_cases() -> list[Case]:
    listing = f"/storage/v1/b/{BUCKET}/o"
    queries = (
        *INTEGERS, "pageToken=%00", "prefix=%FF", "delimiter=" + "/" * 10_000, "matchGlob=[[[",
        "matchGlob=**/**/{a,", "softDeleted=maybe", "versions=maybe", "projection=nonesuch", "fields=((((",
        "startOffset=%00",
    )  # fmt: skip
    found = [Case(f"list ?{q[:30]}", request("GET", f"{listing}?{q}")) for q in queries]
    found += [Case(f"get ?{q[:30]}", request("GET", f"{OBJECT}?{q}")) for q in queries]
    found.append(Case("get softDeleted without generation", request("GET", f"{OBJECT}?softDeleted=true")))
    found.append(Case("get softDeleted generation abc",
                      request("GET", f"{OBJECT}?softDeleted=true&generation=abc")))  # fmt: skip
    junk_range = {"Range": "bytes=9-1"}
    found.append(Case("download Range junk", request("GET", f"{OBJECT}?alt=media", headers=junk_range)))
    found.append(Case("delete ifGenerationMatch abc", request("DELETE", f"{OBJECT}?ifGenerationMatch=abc")))
    paths = (
        "/storage/v1/b/%ZZ/o", "/storage/v1/b/../o", f"/storage/v1/b/{BUCKET}/o/%00",
        f"/storage/v1/b/{BUCKET}/o/" + "n" * 2000, f"/storage/v1/b/{BUCKET}/o/%0A",
        "/storage/v1/b/" + "b" * 300, "/storage/v1/b/-/o", "/storage/v1//b",
        "/storage/v1/b/x/o/y/copyTo/b/%FF/o/z", "/download/storage/v1/b/x/o/", f"/{BUCKET}/%FF%FE",
        "/upload/storage/v1/b//o", "/batch/storage/v1", "/b/%00",
    )  # fmt: skip
    for path in paths:
        found.append(Case(f"GET {path[:40]}", request("GET", path)))
        found.append(Case(f"POST {path[:40]}", request("POST", path, b"{}", JSON)))
    found.append(Case("xml PUT long name", request("PUT", f"/{BUCKET}/" + "x" * 2000, b"data")))
    found.append(Case("xml PUT dot segments", request("PUT", f"/{BUCKET}/../../escape", b"data")))
    batch = {"Content-Type": "multipart/mixed; boundary=b"}
    bad_part = b"--b\r\nContent-Type: application/http\r\n\r\nDELETE\r\n--b--"
    for label, body in (("junk", b"\xff" * 100), ("no parts", b"--b--"), ("bad part", bad_part)):
        found.append(Case(f"batch {label}", request("POST", "/batch/storage/v1", body, batch)))
    found.append(Case("batch not multipart", request("POST", "/batch/storage/v1", b"[]", JSON)))
    frob = {"X-HTTP-Method-Override": "FROB"}
    found.append(Case("method override FROB", request("POST", OBJECT, b"{}", frob)))
    found.append(Case("silent connection", b""))
    return found


def _get(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return json.loads(resp.read() or b"null")


def inventory(port: int) -> dict[str, Any]:
    """Every bucket and every object (with its generation and metageneration), of every project."""
    found: dict[str, Any] = {}
    for bucket in _get(port, "/storage/v1/b")["items"]:
        found[bucket["name"]] = bucket["metageneration"]
        for obj in _get(port, f"/storage/v1/b/{quote(bucket['name'])}/o").get("items") or []:
            found[f"{bucket['name']}/{obj['name']}"] = (obj["generation"], obj["metageneration"])
    return found


def _start_session(port: int) -> str:
    """A resumable session for TAKEN, started while TAKEN does not exist yet; the path of its chunks."""
    url = f"http://127.0.0.1:{port}{UPLOAD}?uploadType=resumable&{TAKEN_QUERY}"
    req = urllib.request.Request(url, data=b"{}", headers=JSON, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        location = resp.headers["Location"]
    return location.removeprefix(f"http://127.0.0.1:{port}")


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> None:
    url = f"http://127.0.0.1:{port}{path}"
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST")
    urllib.request.urlopen(req, timeout=5).close()


def _setup(port: int) -> str:
    """The bucket, a resumable session for TAKEN started while TAKEN did not exist, then TAKEN."""
    _post(port, "/storage/v1/b?project=forja-sandbox", json.dumps({"name": BUCKET}).encode(), JSON)
    session = _start_session(port)
    _post(port, f"{UPLOAD}?uploadType=media&name={quote(TAKEN, safe='')}", CONTENT)
    return session


#: What framing errors and limits get: the status Google's front end would give, never a dropped connection.
FRAMING = {
    "bucket framing: length abc": 400, "bucket framing: length negative": 400,
    "bucket framing: length 10^12": 413, "bucket framing: length longer than body": 408,
    "bucket framing: length twice": 400, "bucket framing: chunked": 411,
    "bucket insert: 5 MB description": 413, "bucket insert: deep lists": 400, "bucket insert: gzip bomb": 413,
    "patch: deep objects": 400,
    "multipart: 5 MB description": 400,  # an upload's body may be large; its JSON strings may not
    "media framing: length 10^12": 408,  # an upload may claim 10^12 bytes: it is given time to send them
    "media: length 6 TiB": 413,  # beyond GCS's own object size
}  # fmt: skip


def test_malformed_requests_get_no_500_no_hung_handler_and_change_nothing(emulator: StorageEmulator) -> None:
    port = emulator.port
    session = _setup(port)
    before = inventory(port)
    sent = cases(session)
    assert len(sent) >= 200
    said = answered(sent, port)
    assert {case: said[case] for case in FRAMING} == FRAMING
    closed = {case for case, status in said.items() if status == "closed"}
    assert closed == {"bucket framing: not http", "silent connection"}, "all else gets an answer"
    assert all(said[case] in (400, 409, 413) for case in said if case.startswith("bucket insert:"))
    bodies = ("patch:", "multipart:", "resumable start:")
    assert all(said[case] in (400, 412, 413) for case in said if case.startswith(bodies))
    ranges = [case for case in said if case.startswith("chunk Content-Range")]
    well_formed = "chunk Content-Range 'bytes 10-19/20'"  # parses, fits its bytes: the precondition says no
    assert [said[case] for case in ranges] == [412 if case == well_formed else 400 for case in ranges]
    assert all(said[f"{kind} ?{query[:30]}"] == 400 for kind in ("list", "get") for query in INTEGERS)
    media = [case for case in said if case.startswith("media: name") or case.endswith(" abc")]
    assert [case for case in media if said[case] != 400] == []
    assert inventory(port) == before, "no malformed request created or changed a bucket or object"
    for listing in ("/storage/v1/b?project=forja-sandbox", "/storage/v1/b", f"/storage/v1/b/{BUCKET}/o"):
        assert send(Case("still serving", request("GET", listing)), port).status == 200


def test_a_non_integer_generation_precondition_is_invalid_argument() -> None:
    request_ = SimpleNamespace(query={"ifGenerationMatch": ["abc"]})
    with pytest.raises(Refused) as refused:
        precondition_holds(request_, SimpleNamespace(objects={}), BUCKET, TAKEN)
    assert (refused.value.status, refused.value.message) == (400, "Invalid argument.")


def test_a_slow_reader_gets_a_large_object_whole(emulator: StorageEmulator) -> None:
    """An answer goes out within the read timeout per MiB, not in all: a download that takes longer
    than 3 s (here 20 MiB at 5 MiB/s) is not cut off (http_limits.IO_PIECE)."""
    size = 20 << 20
    _post(emulator.port, "/storage/v1/b", json.dumps({"name": "forja-slow-reader"}).encode(), JSON)
    _post(emulator.port, "/upload/storage/v1/b/forja-slow-reader/o?uploadType=media&name=big", b"x" * size)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # so the kernel holds little of it
        sock.connect(("127.0.0.1", emulator.port))
        sock.sendall(request("GET", "/storage/v1/b/forja-slow-reader/o/big?alt=media"))
        started, got = time.monotonic(), b""
        while chunk := sock.recv(256 << 10):
            got += chunk
            time.sleep(max(0.0, len(got) / (5 << 20) - (time.monotonic() - started)))
    assert time.monotonic() - started > 3.5
    assert got.endswith(b"\r\n\r\n" + b"x" * size)
