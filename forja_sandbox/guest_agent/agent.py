#!/usr/bin/python3
"""A stand-in for Google's guest agent on sandbox hosts: Linux accounts and SSH keys from metadata.

On GCE the guest agent long-polls the metadata server and turns every `USER:KEY` line of the
instance's `ssh-keys` (and, unless `block-project-ssh-keys` is TRUE, the project's) into a Linux
user with that key in `~/.ssh/authorized_keys`; a key that leaves metadata, or expires, leaves the
file. So access to a VM is a metadata change, and the sandbox's hosts must behave the same way for
forja's tests to mean anything. This script does that part of the agent and nothing else.

With `enable-oslogin=TRUE` it does what Google's OS Login guest pieces do instead: sshd asks
`agent.py authorized-keys USER` (its AuthorizedKeysCommand) for the keys of the user's OS Login
profile, looked up at the metadata server, and the agent makes a local account for each profile
(the real guest's NSS module would resolve it).

It runs inside the host (Ubuntu 22.04, Python 3.10, standard library only), started by
`forja-guest-agent.service`; the metadata server's URL comes from `FORJA_METADATA_URL` (set in
/etc/default/forja-guest-agent). It never logs a key, only user names and counts.
How it differs from Google's agent: forja_sandbox/guest_agent/README.md.
"""

from __future__ import annotations

import base64
import datetime
import grp
import json
import os
import pwd
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

#: The comment line Google's agent writes above each key it manages (and removes with it).
MARKER = "# Added by Google"
#: Groups a new user joins, as the agent's default `groups` setting; missing ones are skipped.
DEFAULT_GROUPS = ("adm", "dip", "docker", "lxd", "plugdev", "video")
SUDO_GROUP = "google-sudoers"
SUDOERS_FILE = "/etc/sudoers.d/google_sudoers"
#: The users this agent created or manages (Google's agent keeps /var/lib/google/google_users).
USERS_FILE = "/var/lib/forja-guest-agent/users"
#: The OS Login accounts this agent made (the real guest resolves them through NSS instead).
OSLOGIN_USERS_FILE = "/var/lib/forja-guest-agent/oslogin-users"
CONFIG_FILE = "/etc/default/forja-guest-agent"
#: sshd's drop-in that hands key lookups to this script while OS Login is on.
SSHD_DROP_IN = "/etc/ssh/sshd_config.d/60-forja-oslogin.conf"
#: Google's agent asks the metadata server to hold a long poll for 60 s.
POLL_TIMEOUT_S = 60
#: Under OS Login, profiles change outside metadata: look at them this often.
OSLOGIN_REFRESH_S = 2
KEY_TYPES = re.compile(r"^(ssh-(rsa|dss|ed25519)|ecdsa-sha2-nistp(256|384|521)|"
                       r"sk-(ssh-ed25519|ecdsa-sha2-nistp256)@openssh\.com)$")
#: Names useradd takes on Ubuntu, and never an option: `-x:KEY` must not reach useradd as a flag.
USER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")
TRUE_WORDS = {"1", "t", "true"}   # Go's strconv.ParseBool, which the real agent uses
FALSE_WORDS = {"0", "f", "false"}


def log(message: str) -> None:
    print(message, flush=True)


# -- what metadata asks for (pure) -------------------------------------------------------------
@dataclass(frozen=True)
class KeyLine:
    """One valid `USER:KEY` entry: the user and the authorized_keys line to write."""

    user: str
    key: str
    expires: datetime.datetime | None


class BadKey(ValueError):
    """A line of `ssh-keys` that is not a valid `USER:KEY` entry (the reason, never the key)."""


def parse_bool(value: str | None) -> bool | None:
    """TRUE/true/1/t and FALSE/false/0/f as Go's ParseBool reads them; anything else is unset."""
    word = (value or "").strip().lower()
    return True if word in TRUE_WORDS else False if word in FALSE_WORDS else None


def parse_expiry(text: str) -> datetime.datetime:
    """`expireOn` in RFC 3339 (`2026-11-24T18:00:00Z`, `+00:00`) or gcloud's `+0000` form."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    match = re.fullmatch(r"(.*[T ]\d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d)(\d\d)", value)
    if match:
        value = f"{match.group(1)}{match.group(2)}:{match.group(3)}"
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError as exc:
        raise BadKey(f"expireOn {text!r} is not an RFC 3339 time") from exc
    if moment.tzinfo is None:
        raise BadKey(f"expireOn {text!r} has no time zone")
    return moment


def parse_key_line(line: str) -> KeyLine:
    """Read one `ssh-keys` line as Google's agent does, or raise BadKey.

    Accepted: `user:ssh-ed25519 AAAA... comment`, `user:ssh-rsa AAAA...`, `user:OPTIONS ssh-rsa
    AAAA...`, and gcloud's expiring form `user:ssh-rsa AAAA... google-ssh {"userName":"...",
    "expireOn":"..."}`.
    """
    text = line.strip()
    user, sep, key = text.partition(":")
    if not sep or not user:
        raise BadKey("the line is not USER:KEY")
    if re.search(r"\s", user):
        raise BadKey("the user name has whitespace")
    if not USER_NAME.match(user):
        raise BadKey("the user name must be up to 32 letters, digits, '_', '.' or '-', not starting with '-'")
    key = key.strip()
    tokens = key.split()
    at = next((i for i, token in enumerate(tokens) if KEY_TYPES.match(token)), None)
    if at is None or at + 1 >= len(tokens):
        raise BadKey(f"user {user}: no key type and key data")
    try:
        blob = base64.b64decode(tokens[at + 1], validate=True)
    except ValueError as exc:
        raise BadKey(f"user {user}: the key data is not base64") from exc
    name_len = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    if name_len < 0 or blob[4:4 + name_len].decode("ascii", "replace") != tokens[at]:
        raise BadKey(f"user {user}: the key data does not hold a {tokens[at]} key")
    comment = " ".join(tokens[at + 2:])
    expires = None
    if comment.startswith("google-ssh"):
        _, _, rest = comment.partition(" ")
        try:
            info = json.loads(rest)
        except ValueError as exc:
            raise BadKey(f"user {user}: a google-ssh key without its JSON expiry") from exc
        if not isinstance(info, dict) or not isinstance(info.get("expireOn"), str):
            raise BadKey(f"user {user}: a google-ssh key without expireOn")
        expires = parse_expiry(info["expireOn"])
    return KeyLine(user, key, expires)


@dataclass(frozen=True)
class Wanted:
    """What the metadata asks of the accounts: keys per user, or hands-off under OS Login."""

    keys: dict[str, list[str]]
    oslogin: bool
    next_expiry: datetime.datetime | None
    skipped: tuple[str, ...]  # why each refused line was refused (user names, never keys)


def wanted(tree: dict[str, Any], now: datetime.datetime) -> Wanted:
    """Users and their keys from the metadata tree (`/computeMetadata/v1/?recursive=true`)."""
    instance = (tree.get("instance") or {}).get("attributes") or {}
    project = (tree.get("project") or {}).get("attributes") or {}
    oslogin = parse_bool(instance.get("enable-oslogin"))
    if oslogin is None:
        oslogin = parse_bool(project.get("enable-oslogin"))
    lines = str(instance.get("ssh-keys") or "").split("\n")
    block = bool(parse_bool(instance.get("block-project-ssh-keys")))
    if instance.get("sshKeys"):  # the legacy key: its presence blocks project keys, as on GCE
        block = True
        lines += str(instance["sshKeys"]).split("\n")
    if not block:
        lines += str(project.get("ssh-keys") or "").split("\n")
        lines += str(project.get("sshKeys") or "").split("\n")
    keys: dict[str, list[str]] = {}
    skipped: list[str] = []
    next_expiry = None
    for line in lines:
        if not line.strip():
            continue
        try:
            entry = parse_key_line(line)
        except BadKey as exc:
            skipped.append(str(exc))
            continue
        if entry.expires is not None:
            if entry.expires <= now:
                continue
            next_expiry = entry.expires if next_expiry is None else min(next_expiry, entry.expires)
        user_keys = keys.setdefault(entry.user, [])
        if entry.key not in user_keys:
            user_keys.append(entry.key)
    return Wanted(keys, bool(oslogin), next_expiry, tuple(skipped))


def authorized_keys_text(current: str, keys: list[str]) -> str:
    """The file with the user's own lines kept and our marked keys replaced by `keys`."""
    kept: list[str] = []
    lines = current.split("\n")
    skip_next = False
    for line in lines:
        if skip_next:
            skip_next = False
            continue
        if line == MARKER:
            skip_next = True
            continue
        if line:
            kept.append(line)
    out = kept + [part for key in keys for part in (MARKER, key)]
    return "".join(line + "\n" for line in out)


# -- acting on the host -----------------------------------------------------------------------
def _run(*argv: str) -> int:
    return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode


def ensure_sudo_group() -> None:
    """The google-sudoers group and its passwordless sudo rule, created once as Google's agent does."""
    try:
        grp.getgrnam(SUDO_GROUP)
    except KeyError:
        _run("groupadd", SUDO_GROUP)
    if not os.path.exists(SUDOERS_FILE):
        fd = os.open(SUDOERS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o440)
        with os.fdopen(fd, "w") as handle:
            handle.write(f"%{SUDO_GROUP} ALL=(ALL:ALL) NOPASSWD:ALL\n")


def create_user(user: str) -> bool:
    """A new login user with a locked password, in the default groups and google-sudoers."""
    if _run("useradd", "-m", "-s", "/bin/bash", "-p", "*", user) != 0:
        log(f"could not create user {user} (useradd refused the name)")
        return False
    for group in (*DEFAULT_GROUPS, SUDO_GROUP):
        try:
            grp.getgrnam(group)
        except KeyError:
            continue
        _run("gpasswd", "-a", user, group)
    return True


def write_authorized_keys(user: str, keys: list[str]) -> bool:
    """Replace our keys in ~user/.ssh/authorized_keys (0600, owned by the user); True if it changed."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return False
    if not entry.pw_dir or entry.pw_shell in ("/sbin/nologin", "/usr/sbin/nologin"):
        return False
    ssh_dir = os.path.join(entry.pw_dir, ".ssh")
    if os.path.islink(ssh_dir):
        log(f"{ssh_dir} is a symbolic link: keys for {user} not written")
        return False
    if not os.path.isdir(ssh_dir):
        os.mkdir(ssh_dir, 0o700)
        os.chown(ssh_dir, entry.pw_uid, entry.pw_gid)
    path = os.path.join(ssh_dir, "authorized_keys")
    try:
        with open(path, encoding="utf-8") as handle:
            current = handle.read()
    except FileNotFoundError:
        current = ""
    text = authorized_keys_text(current, keys)
    if text == current:
        return False
    temp = path + ".google"
    if os.path.lexists(temp):
        os.unlink(temp)
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chown(temp, entry.pw_uid, entry.pw_gid)
    os.replace(temp, path)
    return True


def read_managed(path: str = USERS_FILE) -> set[str]:
    try:
        with open(path, encoding="utf-8") as handle:
            return {line.strip() for line in handle if line.strip()}
    except FileNotFoundError:
        return set()


def write_managed(users: set[str], path: str = USERS_FILE) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    temp = path + ".tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{user}\n" for user in sorted(users)))
    os.chmod(temp, 0o600)
    os.replace(temp, path)


def apply(want: Wanted) -> None:
    """Make the accounts match metadata: create users, write keys, take back keys that left."""
    if want.oslogin:
        return  # under OS Login the real agent leaves ssh-keys (and the keys it wrote) alone
    ensure_sudo_group()
    managed = read_managed()
    for user, keys in sorted(want.keys.items()):
        try:
            pwd.getpwnam(user)
        except KeyError:
            log(f"Creating user {user}.")
            if not create_user(user):
                continue
        if user not in managed:
            _run("gpasswd", "-a", user, SUDO_GROUP)  # an existing user named in metadata gets sudo too
        managed.add(user)
        try:
            if write_authorized_keys(user, keys):
                log(f"Updated keys for user {user} ({len(keys)} key(s)).")
        except OSError as exc:  # one user's broken home must not stop the others
            log(f"could not write keys of user {user}: {exc.strerror or type(exc).__name__}")
    for user in sorted(managed - set(want.keys)):
        log(f"Removing keys and sudo of user {user}: no longer in metadata.")
        try:
            write_authorized_keys(user, [])
        except OSError as exc:
            log(f"could not remove keys of user {user}: {exc.strerror or type(exc).__name__}")
            continue  # still managed: the next answer tries again
        _run("gpasswd", "-d", user, SUDO_GROUP)
        managed.discard(user)
    write_managed(managed)


# -- OS Login ---------------------------------------------------------------------------------
def sshd_drop_in(script: str) -> str:
    """What sshd reads while OS Login is on: ask this script for a user's keys, as root."""
    return (f"# forja-guest-agent: OS Login is on (Google's agent writes the same into sshd_config)\n"
            f"AuthorizedKeysCommand {script} authorized-keys %u\nAuthorizedKeysCommandUser root\n")


def configure_sshd(enabled: bool) -> bool:
    """Add or remove the drop-in and reload sshd when it changed; True if it did."""
    script = os.path.realpath(__file__)
    current = None
    if os.path.exists(SSHD_DROP_IN):
        with open(SSHD_DROP_IN, encoding="utf-8") as handle:
            current = handle.read()
    wanted_text = sshd_drop_in(script) if enabled else None
    if current == wanted_text:
        return False
    if wanted_text is None:
        os.unlink(SSHD_DROP_IN)
    else:
        os.makedirs(os.path.dirname(SSHD_DROP_IN), exist_ok=True)
        with open(SSHD_DROP_IN + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(wanted_text)
        os.chmod(SSHD_DROP_IN + ".tmp", 0o644)
        os.replace(SSHD_DROP_IN + ".tmp", SSHD_DROP_IN)
    _run("systemctl", "try-reload-or-restart", "ssh.service")
    return True


def live_keys(profile: dict[str, Any], now_usec: int) -> list[str]:
    """A profile's keys that have not expired (`expirationTimeUsec`, microseconds since 1970)."""
    keys = []
    for entry in (profile.get("sshPublicKeys") or {}).values():
        expires = entry.get("expirationTimeUsec")
        if isinstance(entry.get("key"), str) and (not expires or int(expires) > now_usec):
            keys.append(entry["key"])
    return keys


def set_sudo(user: str, admin: bool) -> None:
    """Join or leave google-sudoers, touching /etc/group only when membership changes."""
    try:
        member = user in grp.getgrnam(SUDO_GROUP).gr_mem
    except KeyError:
        return
    if member != admin:
        _run("gpasswd", "-a" if admin else "-d", user, SUDO_GROUP)


def sync_oslogin_users(url: str) -> None:
    """A local account (with sudo for admins) for each OS Login profile, as the NSS module gives one."""
    ensure_sudo_group()
    profiles = get_json(url, "oslogin/users", {"pagesize": "1000"}).get("loginProfiles") or []
    before = read_managed(OSLOGIN_USERS_FILE)
    now: set[str] = set()
    for profile in profiles:
        for account in profile.get("posixAccounts") or []:
            user, uid = str(account.get("username", "")), str(account.get("uid", ""))
            if not USER_NAME.match(user) or not uid.isdigit():
                continue
            now.add(user)
            try:
                pwd.getpwnam(user)
            except KeyError:
                log(f"Creating OS Login user {user}.")
                if _run("useradd", "-m", "-s", "/bin/bash", "-p", "*", "-u", uid, "-U", user) != 0:
                    log(f"could not create OS Login user {user}")
                    continue
            admin = get_json(url, "oslogin/authorize", {"email": str(profile.get("name", "")),
                                                        "policy": "adminLogin"}, missing_ok=True)
            set_sudo(user, bool(admin.get("success")))
    for user in sorted(before - now):
        log(f"OS Login user {user} has no profile any more: removing its sudo.")
        set_sudo(user, False)
    if now != before:
        write_managed(now, OSLOGIN_USERS_FILE)


def authorized_keys_command(url: str, user: str) -> int:
    """sshd's AuthorizedKeysCommand under OS Login: print the user's profile keys, if it may log in."""
    try:
        found = get_json(url, "oslogin/users", {"username": user}, missing_ok=True).get("loginProfiles") or []
        if not found:
            return 0
        check = {"email": str(found[0].get("name", "")), "policy": "login"}
        allowed = get_json(url, "oslogin/authorize", check, missing_ok=True)
    except (OSError, ValueError):
        return 0  # no keys: sshd refuses the login
    if allowed.get("success"):
        now_usec = int(time.time() * 1_000_000)
        for key in live_keys(found[0], now_usec):
            print(key)
    return 0


# -- the metadata server ----------------------------------------------------------------------
def config_url() -> str:
    """FORJA_METADATA_URL from the environment, else from the host's config file (sshd's commands
    run with an empty environment)."""
    url = os.environ.get("FORJA_METADATA_URL", "")
    if not url and os.path.exists(CONFIG_FILE):
        with open(CONFIG_FILE, encoding="utf-8") as handle:
            for line in handle:
                name, _, value = line.strip().partition("=")
                if name == "FORJA_METADATA_URL":
                    url = value.strip().strip('"')
    return url


def get_json(base_url: str, path: str, params: dict[str, str], missing_ok: bool = False) -> dict[str, Any]:
    """One plain GET of a JSON answer ({} for a 404 when `missing_ok`)."""
    request = urllib.request.Request(f"{base_url.rstrip('/')}/{path}?{urllib.parse.urlencode(params)}",
                                     headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            answer = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        if missing_ok and exc.code == 404:
            return {}
        raise
    return answer if isinstance(answer, dict) else {}


def fetch(base_url: str, last_etag: str, timeout_s: int) -> tuple[dict[str, Any], str]:
    """One long poll of the whole tree: returns at a change, or after `timeout_s` unchanged."""
    query = urllib.parse.urlencode({"recursive": "true", "alt": "json", "wait_for_change": "true",
                                    "last_etag": last_etag, "timeout_sec": str(timeout_s)})
    request = urllib.request.Request(f"{base_url.rstrip('/')}/?{query}",
                                     headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=timeout_s + 10) as response:
        tree = json.loads(response.read().decode("utf-8"))
        return tree, response.headers.get("ETag") or "NONE"


def poll_timeout(want: Wanted | None, now: datetime.datetime) -> int:
    """60 s, or less when a key expires sooner (so the key goes when it expires, not later)."""
    if want is not None and want.oslogin:
        return OSLOGIN_REFRESH_S
    if want is None or want.next_expiry is None:
        return POLL_TIMEOUT_S
    return max(1, min(POLL_TIMEOUT_S, int((want.next_expiry - now).total_seconds()) + 1))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    url = config_url()
    if not url:
        print(f"FORJA_METADATA_URL is not set: give the metadata server's URL in {CONFIG_FILE}",
              file=sys.stderr)
        return 2
    if args[:1] == ["authorized-keys"] and len(args) == 2:
        return authorized_keys_command(url, args[1])
    if args:
        print("usage: agent.py [authorized-keys USER]", file=sys.stderr)
        return 2
    last_etag, want, failures, said_oslogin, said_skipped = "NONE", None, 0, False, ()
    while True:
        now = datetime.datetime.now(datetime.timezone.utc)
        try:
            tree, last_etag = fetch(url, last_etag, poll_timeout(want, now))
        except (OSError, ValueError) as exc:
            failures += 1
            if failures in (1, 10) or failures % 60 == 0:
                reason = f"HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else type(exc).__name__
                log(f"metadata server not answering ({reason}); retrying")
            time.sleep(1.0)
            continue
        failures = 0
        want = wanted(tree, datetime.datetime.now(datetime.timezone.utc))
        if want.skipped != said_skipped:
            said_skipped = want.skipped
            for reason in want.skipped:
                log(f"ssh-keys line skipped: {reason}")
        if want.oslogin != said_oslogin:
            said_oslogin = want.oslogin
            log("OS Login is enabled: metadata ssh-keys are ignored." if want.oslogin
                else "OS Login is disabled: managing ssh-keys from metadata.")
        try:
            if configure_sshd(want.oslogin):
                log("sshd now asks OS Login for keys." if want.oslogin else "sshd no longer asks OS Login.")
            if want.oslogin:
                sync_oslogin_users(url)
            apply(want)
        except (OSError, ValueError) as exc:  # the next answer tries again
            log(f"could not apply metadata: {type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}")


if __name__ == "__main__":
    sys.exit(main())
