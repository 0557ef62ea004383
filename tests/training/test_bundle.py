"""forja_bundle, run by Ansible as a play runs it (its action plugin, in Ansible's process on the controller).

What the trainer_run role relies on: the same folders give the same file (so a re-run sends nothing),
check mode writes nothing, keys are left out and named, and a file the run needs is never silently lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


def bundle(params: dict, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible")), "localhost", "-i", "localhost,", "-c", "local", "-o",
         "-e", f"ansible_python_interpreter={sys.executable}", *extra,
         "-m", "forja.gpu.forja_bundle", "-a", json.dumps(params)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"})
    assert "=>" in proc.stdout, proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout.split("=>", 1)[1])


def project(tmp_path: Path) -> Path:
    src = tmp_path / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "model.py").write_text("X = 1\n")
    (src / "notes.txt").write_text(KEY)
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref\n")
    return src


def test_the_same_folders_give_the_same_private_file_and_keys_stay_out(tmp_path: Path):
    src, dest = project(tmp_path), tmp_path / "bundles"
    params = {"sources": [{"path": str(src), "prefix": "project"}], "excludes": [".git"], "dest": str(dest),
              "required": ["project/train.py"]}
    rc, first = bundle(params)
    assert rc == 0 and first["changed"] is True, first
    assert first["secrets_excluded"] == ["project/notes.txt"] and first["files"] == 2
    path = Path(first["path"])
    assert path.parent == dest and path.name == first["name"] == f"bundle-{first['sha256'][:16]}.tar.gz"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(dest.stat().st_mode & 0o777) == "0o700"
    assert hashlib.sha1(path.read_bytes()).hexdigest() == first["sha1"]
    with tarfile.open(path) as tar:
        names = tar.getnames()
        assert {m.mtime for m in tar.getmembers()} == {0}
    assert names == [".forja-bundle", "project/pkg/model.py", "project/train.py"]
    os.utime(src / "train.py", (1, 1))  # a new time alone changes nothing
    rc, again = bundle(params)
    assert rc == 0 and again["changed"] is False and again["sha256"] == first["sha256"]


def test_check_mode_and_verify_only_write_nothing(tmp_path: Path):
    src, dest = project(tmp_path), tmp_path / "bundles"
    params = {"sources": [{"path": str(src), "prefix": "project"}], "dest": str(dest)}
    rc, checked = bundle(params, "--check")
    assert rc == 0 and checked["changed"] is True and not Path(checked["path"]).exists()
    rc, verified = bundle({**params, "verify_only": True})
    assert rc == 0 and verified["changed"] is False and verified["path"] == "" and verified["files"] == 3
    assert not list(dest.glob("bundle-*"))


def test_a_file_the_run_needs_that_would_be_left_out_fails_naming_why(tmp_path: Path):
    src, dest = project(tmp_path), tmp_path / "bundles"
    base = {"sources": [{"path": str(src), "prefix": "project"}], "dest": str(dest)}
    rc, out = bundle({**base, "excludes": ["*.py"], "required": ["project/train.py"]})
    assert rc != 0 and "project/train.py: left out by the exclude pattern '*.py'" in out["msg"], out
    rc, out = bundle({**base, "required": ["project/notes.txt"]})
    assert rc != 0 and "its content is an OpenSSH private key" in out["msg"], out
    rc, out = bundle({**base, "required": ["project/gone.py"]})
    assert rc != 0 and "does not exist" in out["msg"], out
    assert not dest.exists()


def test_a_hook_without_its_x_bit_fails_naming_the_chmod(tmp_path: Path):
    """required_executable: a run's hook runs as a program, so packed is not enough."""
    src, dest = project(tmp_path), tmp_path / "bundles"
    (src / "hooks").mkdir()
    (src / "hooks" / "push.sh").write_text("#!/bin/sh\n")
    base = {"sources": [{"path": str(src), "prefix": "project"}], "dest": str(dest), "verify_only": True,
            "required_executable": ["project/hooks/push.sh"]}
    rc, out = bundle(base)
    assert rc != 0 and "project/hooks/push.sh: hooks/push.sh is not executable" in out["msg"], out
    assert f"chmod +x hooks/push.sh, in {src}" in out["msg"], out
    (src / "hooks" / "push.sh").chmod(0o755)
    rc, out = bundle(base)
    assert rc == 0, out
    assert not dest.exists()


def test_bad_options_are_refused_naming_the_option(tmp_path: Path):
    rc, out = bundle({"sources": [{"path": str(tmp_path / "nope"), "prefix": "p"}], "dest": str(tmp_path)})
    assert rc != 0 and "sources[0].path" in out["msg"] and "not a folder on the controller" in out["msg"], out
    rc, out = bundle({"sources": [{"path": str(tmp_path)}], "dest": str(tmp_path)})
    assert rc != 0 and "sources[0]: needs 'path'" in out["msg"], out
    rc, out = bundle({"sources": [], "dest": str(tmp_path), "verify_only": "maybe"})
    assert rc != 0 and "verify_only" in out["msg"], out
