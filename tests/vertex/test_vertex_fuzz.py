"""At least 200 malformed requests against the Vertex emulator: no 500, no hung handler, and it still
serves afterwards. (Before: deep nesting was a RecursionError, a 500; a bad Content-Length dropped
the connection or hung the handler.) The limits: forja_sandbox/http_limits.py.
"""

from __future__ import annotations

import json
import random
from urllib.parse import urlsplit

from fuzz_http import Case, answered, header_cases, json_bodies, request, send

from forja_sandbox.vertex_emulator import VertexEmulator

PARENT = "projects/forja-sandbox/locations/us-central1"
EXECUTOR = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest"
#: A worker pool Vertex would take but for its package, which is nowhere: no mutation starts a job.
POOL = {
    "machineSpec": {"machineType": "n1-standard-4"},
    "replicaCount": "1",
    "pythonPackageSpec": {"executorImageUri": EXECUTOR, "packageUris": ["gs://nowhere/none.tar.gz"],
                          "pythonModule": "task"},
}  # fmt: skip
JOB = {"displayName": "fuzz", "jobSpec": {"workerPoolSpecs": [POOL]}}
LOGS = {"resourceNames": ["projects/forja-sandbox"], "filter": "x"}


def cases() -> list[Case]:
    rng = random.Random(20261129)
    path = f"/v1/{PARENT}/customJobs"
    typed = {"Content-Type": "application/json"}
    jobs = json_bodies(rng, JOB)
    sent = [Case(f"create: {label}", request("POST", path, body, typed)) for label, body in jobs]
    for label, pool in json_bodies(rng, POOL):  # the pool, inside an otherwise good job
        body = b'{"displayName": "fuzz", "jobSpec": {"workerPoolSpecs": [' + pool + b"]}}"
        sent.append(Case(f"pool: {label}", request("POST", path, body, typed)))
    framing = header_cases("POST", path, typed, json.dumps(JOB).encode())
    sent += [Case(f"framing: {label}", raw) for label, raw in framing]
    logs = json_bodies(rng, LOGS)
    sent += [Case(f"logs: {label}", request("POST", "/v2/entries:list", body, typed)) for label, body in logs]
    for query in ("pageSize=-1", "pageSize=abc", "pageToken=%00", "filter=((", "$alt=json;enum-encoding=int"):
        sent.append(Case(f"list ?{query}", request("GET", f"{path}?{query}")))
    return sent


def test_malformed_requests_get_no_500_and_no_hung_handler(emulator: VertexEmulator) -> None:
    sent = cases()
    assert len(sent) >= 200
    port = urlsplit(emulator.url).port
    assert port is not None
    said = answered(sent, port)
    framing = ("framing: length abc", "framing: length 10^12", "framing: length longer than body")
    assert [said[case] for case in framing] == [400, 413, 408]
    assert said["create: deep lists"] == said["pool: deep objects"] == 400
    assert send(Case("list", request("GET", f"/v1/{PARENT}/customJobs")), port).status == 200  # still serving
    assert emulator.store.list(PARENT) == [], "no malformed request started a job"
