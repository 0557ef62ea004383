"""Two processes on one test host, launched by the code that runs one per GPU on a GPU host.

th21 has no GPU: trainer_run_nproc_per_node (auto) finds none through nvidia_facts and takes
trainer_run_cpu_procs (2). Three runs: `train` (examples/own-loop's train.py through
trainer_run_command), `digits-2proc` (the built-in trainer) and `own-drill` (the example from a run
spec's `command:`, slowed down), which these tests stop with SIGTERM and start again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = "/var/lib/forja/runs"
RESULTS = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent")) / "results"


def sudo(host, command: str) -> str:
    return host.check_output(f"sudo {command}")


def env(host, run: str) -> dict[str, str]:
    text = sudo(host, f"cat /etc/forja/train/{run}.env")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def journal(host, run: str) -> str:
    return sudo(host, f"journalctl -u forja-train@{run}.service --no-pager -o cat")


def jsonl(host, path: str) -> list[dict]:
    text = host.run(f"sudo cat {path}").stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def state(host, run: str) -> dict:
    return json.loads(sudo(host, f"/usr/local/lib/forja/forja-train-state {run}"))


def unit_show(host, run: str, prop: str) -> str:
    return sudo(host, f"systemctl show -p {prop} --value forja-train@{run}.service").strip()


def wait_for(what: str, check, timeout_s: float = 240.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def test_the_example_ran_its_own_loop_as_two_processes(host) -> None:
    e = env(host, "train")  # the run's name defaults to the script's
    assert all(key.isupper() for key in e), e  # variables only: nothing else leaks into the env file
    assert (e["FORJA_NPROC_PER_NODE"], e["FORJA_NNODES"]) == ("2", "1")
    log = journal(host, "train")
    assert "--nproc_per_node=2" in log and "--no-python" in log and "project/train.py" in log
    assert "run train completed" in log
    assert "own-loop" in log  # printed with tabulate: the project's requirements.txt was installed
    summary = json.loads(sudo(host, f"cat {ROOT}/train/summary.json"))
    assert (summary["status"], summary["steps"], summary["world_size"]) == ("completed", 60, 2)
    assert summary["last_checkpoint"] == "ckpt-60.pt"


def test_the_example_reports_through_forjas_status_and_results(host) -> None:
    s = state(host, "train")
    assert (s["status"], s["exit_status"], s["total_steps"]) == ("completed", 0, 60)
    assert s["last"]["step"] == 60 and s["last"]["loss"] < 1.0
    fetched = json.loads((RESULTS / "train" / "th21" / "summary.json").read_text())
    assert fetched["status"] == "completed"


def test_the_builtin_trainer_ran_ddp_over_two_processes(host) -> None:
    assert env(host, "digits-2proc")["FORJA_NPROC_PER_NODE"] == "2"
    assert "--nproc_per_node=2" in journal(host, "digits-2proc")
    summary = json.loads(sudo(host, f"cat {ROOT}/digits-2proc/summary.json"))
    assert summary["status"] == "completed" and summary["steps"] == summary["total_steps"] == 60
    assert summary["world_size"] == 2
    assert summary["global_batch"] == 2 * summary["micro_batch"] * summary["accum_steps"]


def test_the_unit_gives_every_process_the_configured_grace(host) -> None:
    assert env(host, "own-drill")["FORJA_STOP_GRACE_S"] == "15"
    assert unit_show(host, "own-drill", "TimeoutStopUSec") == "20s"  # grace + 5 s for the launcher
    assert unit_show(host, "train", "TimeoutStopUSec") == "25s"  # each run its own: the default 20 + 5


def test_sigterm_saves_every_rank_and_a_restart_resumes_from_that_checkpoint(host) -> None:
    run, out = "own-drill", f"{ROOT}/own-drill"
    spec = sudo(host, f"cat /etc/forja/train/{run}.yaml")
    assert "purpose: preemption drill" in spec and "--pause-s" in spec  # the run spec, command included
    wait_for("the drill to log", lambda: len(jsonl(host, f"{out}/metrics.jsonl")) >= 2)

    sudo(host, f"systemctl stop forja-train@{run}.service")  # SIGTERM, as a Spot preemption
    assert unit_show(host, run, "ExecMainStatus") == "3"  # the workers' own code, not torchrun's 1
    summary = json.loads(sudo(host, f"cat {out}/summary.json"))
    saved = summary["steps"]
    assert summary["status"] == "preempted" and summary["last_checkpoint"] == f"ckpt-{saved}.pt"
    preempt = [e for e in jsonl(host, f"{out}/events.jsonl") if e["event"] == "preempt"]
    assert preempt[-1]["signal"] == "SIGTERM" and preempt[-1]["seconds_to_save"] < 15

    sudo(host, f"systemctl start forja-train@{run}.service")
    resumed = wait_for(
        "the restarted drill to resume",
        lambda: [e for e in jsonl(host, f"{out}/events.jsonl") if e["event"] == "resume"],
    )
    assert resumed[-1]["resumed_from_step"] == saved and resumed[-1]["world_size"] == 2
    assert f"resume point {out}/checkpoints/ckpt-{saved}.pt" in journal(host, run)


def down_hooks(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """forja down's first play (playbooks/down_hooks.yml, which teardown.yml imports) on th21."""
    instance = next(e for e in yaml.safe_load(Path(os.environ["MOLECULE_INSTANCE_CONFIG"]).read_text())
                    if e["instance"] == "th21")
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"th21": {
        "ansible_host": instance["address"], "ansible_user": instance["user"],
        "ansible_ssh_private_key_file": instance["identity_file"],
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}}}))
    repo = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory.yml"),
         "playbooks/down_hooks.yml", "-e", "forja_hosts=th21"], cwd=repo, capture_output=True, text=True,
        timeout=300, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"})


def test_the_hooks_run_after_a_preemption_at_forja_down_and_after_the_stop_it_marks(host, tmp_path) -> None:
    """own-drill's trainer_run_hooks: the SIGTERM above was a preemption (its hook ran after the save);
    forja down's play runs the down hook while the run goes on and marks the coming SIGTERM as the
    user's, so the stop that follows (the VM's shutdown) runs the stop hook."""
    run, out = "own-drill", f"{ROOT}/own-drill"

    def notes() -> list[list[str]]:
        return [line.split() for line in sudo(host, f"cat {out}/hook-notes.txt").splitlines()]

    event, noted_run, user, cwd, checkpoints = notes()[0]
    assert (event, noted_run, user, checkpoints) == ("preemption", run, "forja-train", f"{out}/checkpoints")
    assert cwd.startswith("/opt/forja/code/") and cwd.endswith("/project")

    played = down_hooks(tmp_path)
    assert played.returncode == 0, played.stdout[-3000:]
    assert [n[0] for n in notes()] == ["preemption", "down"]
    assert unit_show(host, run, "ActiveState") == "active", "the down hook leaves the run going"

    sudo(host, f"systemctl stop forja-train@{run}.service")  # the VM's shutdown, after forja down
    assert [n[0] for n in notes()] == ["preemption", "down", "stop"]
    preempt = [e for e in jsonl(host, f"{out}/events.jsonl") if e["event"] == "preempt"]
    assert preempt[-1].get("requested_by") == "forja down", "the user's stop, not Google's preemption"
    s = json.loads(sudo(host, f"/usr/local/lib/forja/forja-train-state {run} --journal 5"))
    assert s["hooks"] == {"preemption": "note-hook.sh", "down": "note-hook.sh", "stop": "note-hook.sh"}
    for said in ("preemption hook note-hook.sh exited with 0", "down hook note-hook.sh exited with 0",
                 "noted stop", "stop hook note-hook.sh exited with 0"):
        assert said in sudo(host, f"cat {out}/hook.log"), said
    assert "stop hook note-hook.sh exited with 0" in s["hook_log"]  # what `forja logs` shows
    sudo(host, f"systemctl disable forja-train@{run}.service")
