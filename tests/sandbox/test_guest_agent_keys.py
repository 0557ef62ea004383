"""The guest-agent stand-in reads `ssh-keys` the way Google's guest agent does.

Pure tests of what the agent decides from metadata: which lines are keys (Google's formats,
gcloud's `google-ssh {"userName","expireOn"}` expiry), which users get which keys
(`block-project-ssh-keys`, the legacy `sshKeys`, OS Login), and how authorized_keys keeps the
user's own lines while ours come and go. Real keys are generated with ssh-keygen.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path

import pytest

from forja_sandbox.guest_agent.agent import (
    MARKER,
    BadKey,
    authorized_keys_text,
    parse_bool,
    parse_key_line,
    poll_timeout,
    wanted,
)

NOW = datetime.datetime(2026, 11, 24, 18, 0, tzinfo=datetime.timezone.utc)


def _keygen(tmp: Path, kind: str, name: str) -> str:
    path = tmp / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"{name}@test", "-f", str(path)],
                   check=True)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("keys")
    return {"ed": _keygen(tmp, "ed25519", "ed"), "ed2": _keygen(tmp, "ed25519", "ed2"),
            "ecdsa": _keygen(tmp, "ecdsa", "ec")}


def expiring(key: str, user: str, expire_on: str) -> str:
    kind, data = key.split()[:2]
    return f"{user}:{kind} {data} google-ssh " + json.dumps({"userName": f"{user}@example.com",
                                                              "expireOn": expire_on})


def tree(instance: dict[str, str] | None = None, project: dict[str, str] | None = None) -> dict:
    return {"instance": {"attributes": instance or {}}, "project": {"attributes": project or {}}}


def test_a_plain_line_gives_its_user_the_key_as_written(keys: dict[str, str]) -> None:
    entry = parse_key_line(f"ansible:{keys['ed']}")
    assert (entry.user, entry.key, entry.expires) == ("ansible", keys["ed"], None)


def test_key_options_before_the_type_are_kept(keys: dict[str, str]) -> None:
    entry = parse_key_line(f'alice:no-port-forwarding,from="10.0.0.1" {keys["ecdsa"]}')
    assert entry.user == "alice" and entry.key.startswith('no-port-forwarding,from="10.0.0.1" ecdsa-sha2-')


@pytest.mark.parametrize("expire_on", ["2026-11-24T18:05:00+0000", "2026-11-24T18:05:00Z",
                                       "2026-11-24T19:05:00+01:00"])
def test_gcloud_expiry_forms_are_read(keys: dict[str, str], expire_on: str) -> None:
    entry = parse_key_line(expiring(keys["ed"], "bob", expire_on))
    assert entry.expires == NOW + datetime.timedelta(minutes=5)


@pytest.mark.parametrize("line, reason", [
    ("no colon here", "not USER:KEY"),
    (":ssh-ed25519 AAAA", "not USER:KEY"),
    ("al ice:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB", "whitespace"),
    ("alice:ssh-ed25519", "no key type and key data"),
    ("-oProxyCommand=x:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB", "not starting with '-'"),
    ("../../etc:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB", "letters, digits"),
    ("alice:ssh-ed25519 not*base64", "not base64"),
    ("alice:ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIGZha2U=", "does not hold a ssh-rsa key"),
])
def test_malformed_lines_are_refused_without_repeating_the_key(line: str, reason: str) -> None:
    with pytest.raises(BadKey, match=reason) as caught:
        parse_key_line(line)
    assert "AAAA" not in str(caught.value)


def test_a_google_ssh_comment_without_expiry_is_refused(keys: dict[str, str]) -> None:
    kind, data = keys["ed"].split()[:2]
    with pytest.raises(BadKey, match="expiry"):
        parse_key_line(f"bob:{kind} {data} google-ssh not-json")
    with pytest.raises(BadKey, match="RFC 3339"):
        parse_key_line(expiring(keys["ed"], "bob", "tomorrow"))


def test_expired_keys_are_dropped_and_the_next_expiry_shortens_the_poll(keys: dict[str, str]) -> None:
    lines = "\n".join([f"ansible:{keys['ed']}", expiring(keys["ed2"], "bob", "2026-11-24T17:59:00Z"),
                       expiring(keys["ecdsa"], "carol", "2026-11-24T18:00:20Z"), "garbage", ""])
    want = wanted(tree({"ssh-keys": lines}), NOW)
    assert want.keys == {"ansible": [keys["ed"]], "carol": [want.keys["carol"][0]]}
    assert want.keys["carol"][0].startswith("ecdsa-sha2-nistp256 ")
    assert want.skipped == ("the line is not USER:KEY",)
    assert want.next_expiry == NOW + datetime.timedelta(seconds=20)
    assert poll_timeout(want, NOW) == 21
    assert poll_timeout(wanted(tree({"ssh-keys": f"ansible:{keys['ed']}"}), NOW), NOW) == 60


def test_project_keys_count_unless_the_instance_blocks_them(keys: dict[str, str]) -> None:
    project = {"ssh-keys": f"ops:{keys['ed2']}"}
    both = wanted(tree({"ssh-keys": f"ansible:{keys['ed']}"}, project), NOW)
    assert both.keys == {"ansible": [keys["ed"]], "ops": [keys["ed2"]]}
    blocking = {"ssh-keys": f"ansible:{keys['ed']}", "block-project-ssh-keys": "TRUE"}
    blocked = wanted(tree(blocking, project), NOW)
    assert blocked.keys == {"ansible": [keys["ed"]]}
    legacy = wanted(tree({"sshKeys": f"old:{keys['ecdsa']}"}, project), NOW)
    assert list(legacy.keys) == ["old"], "the legacy sshKeys key blocks project keys, as on GCE"


def test_instance_oslogin_overrides_the_project(keys: dict[str, str]) -> None:
    assert wanted(tree({}, {"enable-oslogin": "TRUE"}), NOW).oslogin is True
    assert wanted(tree({"enable-oslogin": "false"}, {"enable-oslogin": "TRUE"}), NOW).oslogin is False
    assert wanted(tree({"enable-oslogin": "maybe"}, {"enable-oslogin": "1"}), NOW).oslogin is True
    words = ("TRUE", "t", "0", "False", "yes", None)
    assert [parse_bool(v) for v in words] == [True, True, False, False, None, None]


def test_authorized_keys_keeps_the_users_own_lines_and_replaces_ours(keys: dict[str, str]) -> None:
    own = "# my laptop\n" + keys["ecdsa"] + "\n"
    first = authorized_keys_text(own, [keys["ed"], keys["ed2"]])
    assert first == own + f"{MARKER}\n{keys['ed']}\n{MARKER}\n{keys['ed2']}\n"
    assert authorized_keys_text(first, [keys["ed2"]]) == own + f"{MARKER}\n{keys['ed2']}\n"
    assert authorized_keys_text(first, []) == own
    unchanged = authorized_keys_text(first, [keys["ed"], keys["ed2"]])
    assert unchanged == first, "an unchanged set rewrites nothing"
