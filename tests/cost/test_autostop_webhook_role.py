"""The autostop role's webhook variable, checked on localhost without a host: the agent's config names
the root-only URL file only when a URL is set, the file is compared by checksum (never by the URL),
and a URL that is not http(s) stops the role before anything changes, without showing the URL.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from localplay import REPO

ROLE = REPO / "roles/autostop"
STATE_VARS = yaml.safe_load((ROLE / "tasks/state.yml").read_text())[0]["vars"]
SECRET = "s3cr3t-t0ken"


def play(tmp_path: Path, webhook: str | None) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "result.json"
    tasks = [
        {"name": "Load autostop's defaults",
         "ansible.builtin.include_vars": {"file": str(ROLE / "defaults/main.yml")}},
        {"name": "Validate as the role does",
         "ansible.builtin.include_tasks": str(ROLE / "tasks/validate.yml")},
        {"name": "Write the result", "ansible.builtin.copy": {"dest": str(out), "mode": "0600", "content": (
            "{{ {'config': lookup('ansible.builtin.template', '" + str(ROLE / "templates/autostop.json.j2")
            + "') | from_json, 'files': autostop_webhook_files} | to_json }}")},
         "vars": {"autostop_webhook_files": STATE_VARS["autostop_webhook_files"]}},
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "name": "The autostop role's variables", "hosts": "localhost", "gather_facts": False,
        "roles": ["forja.gpu.host_contract"], "tasks": tasks}]))
    given = tmp_path / "vars.yml"  # the URL in a file, as an inventory holds it: never in argv
    given.write_text(yaml.safe_dump({} if webhook is None else {"notify_webhook": webhook}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
           "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_LOCALHOST_WARNING": "false"}
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"@{given}", str(tmp_path / "play.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    return proc, (json.loads(out.read_text()) if out.exists() else {})


def test_a_webhook_is_a_root_only_file_named_by_the_config(tmp_path):
    url = f"https://hooks.example.com/services/{SECRET}"
    proc, seen = play(tmp_path, url)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert seen["config"]["notify_webhook_file"] == "/etc/forja/notify_webhook"
    assert SECRET not in json.dumps(seen["config"])
    [entry] = seen["files"]
    assert entry["mode"] == "0600" and entry["checksum"] == hashlib.sha1(url.encode()).hexdigest()
    assert SECRET not in proc.stdout + proc.stderr


def test_no_webhook_means_no_file_and_no_notifications(tmp_path):
    proc, seen = play(tmp_path, None)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert seen["config"]["notify_webhook_file"] == "" and seen["files"] == []


def test_a_webhook_that_is_not_http_stops_the_role_naming_the_variable_not_the_url(tmp_path):
    proc, seen = play(tmp_path, f"ftp://hooks.example.com/{SECRET}")
    assert proc.returncode != 0 and not seen
    assert "autostop_notify_webhook" in proc.stdout and "not an http(s) URL" in proc.stdout
    assert SECRET not in proc.stdout + proc.stderr
