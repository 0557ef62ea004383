"""What a run sends is what the user meant (issue 32 part 5), said before it goes (issue 29 part 3).

- the secret check knows key formats by content, so source code that mentions a key is sent and a
  key file is left out with the kind of key it is, whatever either is called;
- the project defaults to the config's or script's own (its git root), none for a built-in config,
  never forja's clone.

Plain functions on temporary folders; the consent question and the snapshot are
tests/cli/test_consent_snapshot.py's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from forja import module_utils
from forja.project import FORJA_TREE, TRAINER_DIR, default_project

files = module_utils.load("forja_files")

PEM_BODY = "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
OPENSSH = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


@pytest.mark.parametrize(("name", "content", "kind"), [
    ("id_deploy", OPENSSH, "an OpenSSH private key"),
    ("server.txt", f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_BODY}-----END RSA PRIVATE KEY-----\n",
     "a PEM RSA private key"),
    ("notes.md", f"my key:\n\n  -----BEGIN PRIVATE KEY-----\n{PEM_BODY}-----END PRIVATE KEY-----\n",
     "a PEM private key"),
    ("owner.json", json.dumps({"type": "service_account", "private_key": "x", "client_email": "a@b"}),
     "a Google service-account key (JSON with a private_key)"),
    ("adc.json", json.dumps({"type": "authorized_user", "refresh_token": "1//x", "client_id": "c"}),
     "Google user credentials (JSON with a refresh_token)"),
    ("me.ppk", "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n", "a PuTTY private key"),
    ("backup.asc", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n", "a PGP private key"),
    # what only mentions a key: forja's own tests and emulators, which the clone once sent as "keys"
    ("test_auth.py", f"KEY = {OPENSSH!r}\n", None),
    ("test_push.py", 'PEM = (\n    "-----BEGIN RSA PRIVATE KEY-----\\n"\n)\n', None),
    ("auth.py", 'info = {"type": "service_account", "private_key": pem}\n', None),
    ("prepare.yml", 'content: "-----BEGIN OPENSSH PRIVATE KEY-----\\nx\\n"\n', None),
    ("config.json", json.dumps({"type": "service_account", "client_email": "a@b"}), None),
    ("public.pem.txt", "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYI\n-----END PUBLIC KEY-----\n", None),
])
def test_a_key_is_known_by_its_format_not_its_name(tmp_path: Path, name: str, content: str,
                                                    kind: str | None) -> None:
    (tmp_path / name).write_text(content)
    assert files.secret_kind(str(tmp_path / name)) == kind
    walked = files.walk(str(tmp_path), [], True)
    assert walked.secrets == ([name] if kind else [])
    if kind:
        assert walked.why[name] == f"its content is {kind}"


def test_a_walk_says_why_each_thing_was_left_out(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "big.bin").write_bytes(b"x")
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "link.py").symlink_to(tmp_path / "train.py")
    walked = files.walk(str(tmp_path), [".git", "data/*"], True)
    assert [f.rel for f in walked.files] == ["train.py"]
    assert walked.why == {".git/": "matches '.git'", "data/big.bin": "matches 'data/*'",
                          "link.py": "a symlink"}


def git_repo(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    return folder


def test_the_project_is_the_config_or_script_s_own(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "mine")
    (repo / "configs").mkdir()
    config = repo / "configs" / "run.yaml"
    config.write_text("model: m\n")
    script = repo / "src" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert default_project(config, None, elsewhere) == repo.resolve()  # its git root, wherever forja runs
    assert default_project(None, script, elsewhere) == repo.resolve()
    plain = tmp_path / "plain"
    (plain / "sub").mkdir(parents=True)
    (plain / "sub" / "c.yaml").write_text("")
    assert default_project(plain / "sub" / "c.yaml", None, plain) == plain  # outside git: where you are
    assert default_project(plain / "sub" / "c.yaml", None, elsewhere) is None  # not a folder to guess
    assert default_project(None, plain / "sub" / "c.py", elsewhere) == plain / "sub"  # a script's own


def test_a_built_in_config_sends_no_project_and_the_clone_is_never_sent(tmp_path: Path) -> None:
    assert default_project(TRAINER_DIR / "configs" / "digits.yaml", None, FORJA_TREE) is None
    if (FORJA_TREE / ".git").exists():  # a clone (an installed copy has no clone to send)
        assert default_project(FORJA_TREE / "examples" / "sweep" / "x.yaml", None, tmp_path) is None
        script = FORJA_TREE / "examples" / "own-loop" / "train.py"
        assert default_project(None, script, tmp_path) == script.parent
