"""At least 200 malformed requests against the Compute emulator (also the sandbox users reach): no 500,
no hung handler, and it still serves a real client afterwards.

Before: deep JSON nesting (RecursionError), `networkInterfaces: [null]` and fault rules with a bad
`delay_s` were 500s; `Content-Length: abc` or 10^12 dropped the connection; a length longer than the
body hung the handler (no read timeout); a fault status "abc" dropped the connection and 999 was
sent back; a 5 MB description and 100k metadata items were accepted, and every later listing was
then about 10 times slower. The limits chosen: forja_sandbox/compute_emulator/README.md.
"""

from __future__ import annotations

import json
import random
from urllib.parse import urlsplit

from emulator_helpers import PROJECT, ZONE, Client, l4_body
from fuzz_http import Case, answered, header_cases, json_bodies, request

from forja_sandbox.compute_emulator import ComputeEmulator

#: Fault rules that would break every later request if they were kept.
BAD_RULES = (
    {"status": "abc"}, {"status": 999}, {"status": -1}, {"status": 200}, {"delay_s": "x"}, {"delay_s": -5},
    {"delay_s": 1e9}, {"times": "x"}, {"times": -1}, {"error": 5}, {"method": None, "status": 503},
    {"no_such": 1}, [], "text", None, {"status": [503]},
)  # fmt: skip


def cases(emu: ComputeEmulator, token: str) -> list[Case]:
    rng = random.Random(20261129)
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    base = urlsplit(emu.base_url).path + f"projects/{PROJECT}"
    insert = f"{base}/zones/{ZONE}/instances"
    good = l4_body("fuzz-vm")
    found: list[Case] = []
    for label, body in json_bodies(rng, good):
        found.append(Case(f"insert: {label}", request("POST", insert, body, auth)))
    for label, body in json_bodies(rng, {"fingerprint": "x", "items": [{"key": "a", "value": "b"}]}):
        found.append(Case(f"setMetadata: {label}", request("POST", f"{insert}/vm/setMetadata", body, auth)))
    for label, raw in header_cases("POST", insert, auth, json.dumps(good).encode()):
        found.append(Case(f"framing: {label}", raw))
    for rule in BAD_RULES:
        raw = request("POST", "/emulator/v1/faults", json.dumps(rule).encode())
        found.append(Case(f"fault rule {rule!r}", raw))
    for form in (b"grant_type=", b"\xff\xfe", b"assertion=" + b"a" * 100_000, b"=&=&&"):
        found.append(Case(f"token form {form[:20]!r}", request("POST", "/token", form)))
    for query in ("maxResults=-1", "maxResults=abc", "filter=name%3D", "fields=items(((", "pageToken=%00",
                  "orderBy=" + "x" * 10_000, "returnPartialSuccess=maybe"):  # fmt: skip
        found.append(Case(f"list ?{query[:30]}", request("GET", f"{insert}?{query}", headers=auth)))
    return found


def test_malformed_requests_get_no_500_and_no_hung_handler(emu: ComputeEmulator, client: Client) -> None:
    token = client.session.headers["Authorization"].removeprefix("Bearer ")
    sent = cases(emu, token)
    assert len(sent) >= 200
    port = urlsplit(emu.base_url).port
    assert port is not None
    said = answered(sent, port)
    assert {case: said[case] for case in FRAMING} == FRAMING  # Google's statuses, not a dropped connection
    assert all(said[c.name] == 400 for c in sent if c.name.startswith("fault rule"))
    assert client.get(f"zones/{ZONE}/instances").status_code == 200  # still serving
    assert not emu.faults.rules, "no invalid fault rule was kept"


#: What a framing error gets: the status Google's front end would give, never a dropped connection.
FRAMING = {
    "framing: length abc": 400, "framing: length negative": 400, "framing: length 10^12": 413,
    "framing: length longer than body": 408, "framing: length twice": 400, "framing: chunked": 411,
    "insert: 5 MB description": 413, "insert: 100k metadata items": 413, "insert: deep objects": 400,
    "insert: deep lists": 400,
}  # fmt: skip
