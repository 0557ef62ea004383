"""Malformed HTTP requests, sent raw over a socket: what the emulators must answer without a 500 or a hang.

A module of its own because every emulator's test uses it (Compute, Vertex). The cases are built
from a seeded generator: the same 200+ requests on every run. Each is sent on a fresh connection;
the answer is the status line, or "closed" when the server closed the connection without one (which
is fine: it refused), or "timeout" when nothing came within ``timeout_s`` (a hung handler).
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    raw: bytes


@dataclass(frozen=True)
class Answer:
    case: str
    status: int | str  # an HTTP status, "closed" or "timeout"
    seconds: float


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
            length: str | None = None) -> bytes:  # fmt: skip
    """A raw HTTP/1.1 request; ``length`` overrides Content-Length (any text, even a wrong one)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    elif body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def json_bodies(rng: random.Random, good: dict) -> Iterator[tuple[str, bytes]]:
    """Bodies a client could send by mistake or malice, around one good body."""
    text = json.dumps(good)
    yield "truncated", text[: len(text) // 2].encode()
    yield "empty object", b"{}"
    yield "a list", b"[]"
    yield "null", b"null"
    yield "a string", b'"instance"'
    yield "a number", b"42"
    yield "NaN token", b'{"name": NaN}'
    yield "invalid utf-8", b'{"name": "\xff\xfe"}'
    yield "deep objects", b'{"a":' * 5000 + b"1" + b"}" * 5000
    yield "deep lists", b"[" * 100000 + b"]" * 100000
    yield "unclosed deep", b"[" * 200000
    yield "5 MB description", json.dumps({**good, "description": "x" * 5_000_000}).encode()
    yield "100k metadata items", json.dumps(
        {**good, "metadata": {"items": [{"key": f"k{i}", "value": "v"} for i in range(100_000)]}}).encode()
    for key in list(good)[:12]:
        for label, value in (("null", None), ("number", 5), ("list of null", [None]), ("object", {"x": None}),
                             ("list of numbers", [1, 2]), ("long string", "y" * 300_000), ("bool", True)):
            yield f"{key} as {label}", json.dumps({**good, key: value}).encode()
    for key, value in good.items():  # one level down: each field of a nested object or list of objects
        inner = value[0] if isinstance(value, list) and value and isinstance(value[0], dict) else value
        if isinstance(inner, dict):
            for sub in list(inner)[:6]:
                for label, bad in (("null", None), ("list of null", [None]), ("number", -1)):
                    broken = {**inner, sub: bad}
                    yield f"{key}.{sub} as {label}", json.dumps({**good, key: [broken] if inner is not value
                                                                       else broken}).encode()  # fmt: skip
    for _ in range(20):  # random JSON of the good body's keys with values of any type
        yield "random typed fields", json.dumps({k: random_value(rng, 3) for k in rng.sample(list(good),
                                                 k=max(1, len(good) // 2))}).encode()  # fmt: skip
    for _ in range(20):  # random junk, printable and not
        size = rng.randint(1, 4000)
        yield "random bytes", bytes(rng.getrandbits(8) for _ in range(size))


def random_value(rng: random.Random, depth: int) -> object:
    kinds = ["null", "int", "float", "str", "bool", "list", "dict"] if depth else ["null", "int", "str"]
    kind = rng.choice(kinds)
    if kind == "list":
        return [random_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    if kind == "dict":
        return {rng.choice(["name", "key", "value", "items", "type", "x"]): random_value(rng, depth - 1)
                for _ in range(rng.randint(0, 3))}  # fmt: skip
    return {"null": None, "int": rng.randint(-(2**63), 2**63), "float": rng.uniform(-1e300, 1e300),
            "str": "".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(0, 40))),
            "bool": rng.random() < 0.5}[kind]  # fmt: skip


def header_cases(method: str, path: str, auth: dict[str, str], good: bytes) -> Iterator[tuple[str, bytes]]:
    """Broken framing: what a wrong or hostile client puts in the headers."""
    yield "length abc", request(method, path, good, auth, length="abc")
    yield "length negative", request(method, path, good, auth, length="-1")
    yield "length 10^12", request(method, path, good, auth, length=str(10**12))
    yield "length longer than body", request(method, path, good, auth, length=str(len(good) + 1000))
    yield "length shorter than body", request(method, path, good, auth, length=str(max(1, len(good) // 2)))
    yield "length twice", request(method, path, good, {**auth, "Content-Length": "5"}, length=str(len(good)))
    chunked = {**auth, "Transfer-Encoding": "chunked"}
    yield "chunked", request(method, path, b"5\r\nhello\r\n0\r\n\r\n", chunked)
    yield "no authorization", request(method, path, good)
    yield "junk authorization", request(method, path, good, {"Authorization": "Bearer \x00\xff junk"})
    yield "huge header", request(method, path, good, {**auth, "X-Big": "z" * 70_000})
    yield "unknown verb", request("FROB", path, good, auth)
    yield "long path", request(method, path + "/" + "p" * 100_000, good, auth)
    yield "bad escapes", request(method, path + "/%ZZ%00%", good, auth)
    yield "dot segments", request(method, "/../../../etc/passwd", good, auth)
    junk = "?fields=((((&maxResults=abc&filter=%28%28&pageToken=~"
    yield "query junk", request(method, path + junk, good, auth)
    yield "not http", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(100)


def send(case: Case, port: int, timeout_s: float = 5.0) -> Answer:
    """Send one case on a fresh connection; the status, or how the connection ended."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # refused before reading it all
            sock.sendall(case.raw)
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            return Answer(case.name, "timeout", time.monotonic() - started)
        except ConnectionResetError:
            return Answer(case.name, "closed", time.monotonic() - started)
    seconds = time.monotonic() - started
    if not data:
        return Answer(case.name, "closed", seconds)
    parts = data.split(b"\r\n", 1)[0].split()
    status = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else "closed"
    return Answer(case.name, status, seconds)


def answered(cases: list[Case], port: int) -> dict[str, int | str]:
    """Send every case; fail on a 500 (or a status beyond HTTP's) and on any hung handler; return
    each case's status."""
    answers = [send(case, port) for case in cases]
    errors = [a for a in answers if a.status == 500 or (isinstance(a.status, int) and a.status >= 600)]
    hung = [a for a in answers if a.status == "timeout" or a.seconds > 5]
    assert not errors, errors
    assert not hung, hung
    return {a.case: a.status for a in answers}
