"""What the trainer_run role leaves on the two hosts after a 2-node torchrun of the digits demo.

th3 is rank 0 (rendezvous host, PyTorch installed into the venv), th4 is rank 1 (reuses the
system-wide PyTorch that prepare.yml installed, as it would reuse the Deep Learning VM's).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

RUN = "digits-2node"
OUT = f"/var/lib/forja/runs/{RUN}"
UNIT = f"forja-train@{RUN}.service"
RESULTS = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent")) / "results"


def name(host) -> str:
    return host.ansible.get_variables()["inventory_hostname"]


def exists(host, path: str) -> bool:
    """The run's folder is private to the run user (0750): look as root."""
    return host.run(f"sudo test -e {path}").rc == 0


def read(host, path: str) -> str:
    return host.check_output(f"sudo cat {path}")


def env(host) -> dict[str, str]:
    text = host.check_output(f"sudo cat /etc/forja/train/{RUN}.env")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_the_unit_template_restarts_crashes_but_not_bad_configs(host) -> None:
    unit = host.file("/etc/systemd/system/forja-train@.service").content_string
    assert "Restart=on-failure" in unit
    assert "RestartPreventExitStatus=2 75" in unit
    assert "ExecCondition=/usr/local/lib/forja/forja-train-launch --check" in unit
    assert "User=forja-train" in unit


def test_the_run_completed_on_both_nodes_and_stays_enabled_for_reboots(host) -> None:
    assert exists(host, f"{OUT}/COMPLETED")
    assert host.service(UNIT).is_enabled
    state = json.loads(host.check_output(f"sudo /usr/local/lib/forja/forja-train-state {RUN}"))
    assert state["status"] == "completed" and state["exit_status"] == 0


def test_ranks_and_rendezvous_come_from_the_play_order(host) -> None:
    e = env(host)
    assert e["FORJA_NNODES"] == "2"
    assert e["FORJA_NODE_RANK"] == {"th3": "0", "th4": "1"}[name(host)]
    assert e["FORJA_MASTER_ADDR"] == "10.213.0.13"
    assert e["GLOO_SOCKET_IFNAME"] == "eth0"


def test_both_ranks_trained_together_and_agree_on_the_result(host) -> None:
    journal = host.check_output(f"sudo journalctl -u {UNIT} --no-pager -o cat")
    assert "--nnodes=2" in journal and f"run {RUN} completed" in journal
    if name(host) == "th3":
        summary = json.loads(read(host, f"{OUT}/summary.json"))
        # world_size 2 and the global batch twice the micro-batch: the steps ran as one job over two
        # processes whose gradients were all-reduced; the eval is sharded and summed across ranks.
        assert summary["status"] == "completed" and summary["steps"] == summary["total_steps"]
        assert summary["world_size"] == 2
        assert summary["global_batch"] == 2 * summary["micro_batch"] * summary["accum_steps"]
        assert summary["accuracy"] >= 0.8
    else:
        assert not exists(host, f"{OUT}/summary.json"), "only rank 0 writes the run files"


def test_an_existing_fitting_pytorch_is_reused_else_installed_into_the_venv(host) -> None:
    cfg = host.file("/opt/forja/trainer-venv/pyvenv.cfg").content_string
    venv_torch = host.file("/opt/forja/trainer-venv/lib/python3.10/site-packages/torch").exists
    if name(host) == "th4":
        assert "include-system-site-packages = true" in cfg and not venv_torch
    else:
        assert "include-system-site-packages = false" in cfg and venv_torch
    python = "/opt/forja/trainer-venv/bin/python"
    version = host.check_output(f"{python} -c 'import torch; print(torch.__version__)'")
    assert version.startswith("2.7.")


def test_the_project_arrives_without_secrets_and_junk(host) -> None:
    code = env(host)["FORJA_CODE"]
    files = host.check_output(f"sudo find {code} -type f -printf '%P\\n'").splitlines()
    assert "project/pkg/__init__.py" in files and "project/notes.txt" in files
    assert "trainer/__main__.py" in files and "trainer/configs/digits.yaml" in files
    junk = (".env", ".git/", "scratch/", "__pycache__", "keys/")
    leaked = [f for f in files if any(bad in f for bad in junk)]
    assert leaked == []
    assert host.run(f"sudo grep -r molecule-secret-token {code}").rc == 1


def test_a_second_run_on_the_same_output_folder_is_refused(host) -> None:
    # The outer flock holds the lock while a second launcher starts: it must refuse, not train.
    launcher = "/usr/local/lib/forja/forja-train-launch"
    inner = f"set -a; . /etc/forja/train/{RUN}.env; set +a; flock {OUT}/.lock {launcher}"
    result = host.run(f"sudo bash -c {inner!r}; echo rc=$?")
    assert "rc=75" in result.stdout
    assert "another run is already writing" in result.stdout + result.stderr


def test_a_completed_run_is_never_started_again(host) -> None:
    stamp = f"sudo stat -c %Y {OUT}/COMPLETED"
    before = host.check_output(stamp)
    host.run(f"sudo systemctl start {UNIT}")
    assert host.service(UNIT).is_running is False
    assert host.check_output(stamp) == before
    assert "already completed" in journal_once_it_says(host, "already completed")


def journal_once_it_says(host, text: str, timeout_s: float = 15.0) -> str:
    """The unit's journal, read again until it holds `text` or `timeout_s` passes.

    journald reads a service's stdout asynchronously, so the line the ExecCondition printed can
    land after systemd's own "Skipped due to 'exec-condition'".
    """
    deadline = time.monotonic() + timeout_s
    while True:
        journal = host.check_output(f"sudo journalctl -u {UNIT} --no-pager -o cat")
        if text in journal or time.monotonic() > deadline:
            return journal
        time.sleep(0.5)


def test_results_came_back_to_the_controller(host) -> None:
    if name(host) != "th3":
        return
    folder = RESULTS / "th3"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "completed"
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) >= 3 and lines[-1]["step"] == summary["steps"]
    assert list((folder / "plots").glob("*.png"))
    assert not list(folder.rglob("*.pt"))
