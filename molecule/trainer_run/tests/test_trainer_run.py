"""What the trainer_run role leaves on the two hosts after a 2-node torchrun of the digits demo.

th3 is rank 0 (rendezvous host, plain Ubuntu: PyTorch installed into the venv), th4 is rank 1 (the
Deep Learning VM layer: the role finds the image's PyTorch and layers the trainer on it). The
project's requirements.txt went into an environment of its own on both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

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
    # the template's own line (tests/training/test_trainer_exit_codes.py keeps it equal to NO_RESTART)
    role = Path(__file__).resolve().parents[3] / "roles" / "trainer_run"
    template = role / "templates" / "forja-train@.service.j2"
    (line,) = [x for x in template.read_text().splitlines() if x.startswith("RestartPreventExitStatus=")]
    assert line in unit.splitlines()
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
    # elastic torchrun: every node needed by default, a restart budget, and this node's rendezvous name,
    # which every node maps to its address (the names sort by node rank: torch's RANK 0 is on node 0)
    assert (e["FORJA_MIN_NODES"], e["FORJA_MAX_RESTARTS"]) == ("2", "3")
    assert e["FORJA_NODE_ADDR"] == f"forja-{RUN}-node00{e['FORJA_NODE_RANK']}"
    hosts = read(host, "/etc/hosts").splitlines()
    assert hosts[1:3] == [f"10.213.0.13 forja-{RUN}-node000", f"10.213.0.14 forja-{RUN}-node001"], hosts[:4]


def test_both_ranks_trained_together_and_agree_on_the_result(host) -> None:
    journal = host.check_output(f"sudo journalctl -u {UNIT} --no-pager -o cat")
    assert "--nnodes=2:2 " in journal and "--rdzv_backend=c10d" in journal
    assert f"run {RUN} completed" in journal
    elastic = json.loads(read(host, f"{OUT}/elastic.json"))  # no node was lost: no restart
    assert (elastic["restart_count"], elastic["world_size"]) == (0, 2)
    assert elastic["rank"] == elastic["group_rank"] == int(env(host)["FORJA_NODE_RANK"])
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


IMAGE_TORCH = "/usr/local/lib/python3.10/dist-packages/torch"  # where the dlvm layer keeps PyTorch
TRAINER_ENV = "/opt/forja/trainer-venv"


def python_says(host, python: str, code: str) -> list[str]:
    return host.check_output(f"{python} -W ignore -c {code!r}").split()


def test_the_images_pytorch_is_found_and_layered_on_else_installed_into_the_venv(host) -> None:
    version, torch_file = python_says(host, f"{TRAINER_ENV}/bin/python",
                                      "import torch; print(torch.__version__, torch.__file__)")
    assert version.startswith("2.7.1")
    own_torch = host.file(f"{TRAINER_ENV}/lib/python3.10/site-packages/torch").exists
    pins = host.file(f"{TRAINER_ENV}/forja-constraints.txt").content_string.splitlines()
    if name(host) == "th4":
        assert torch_file.startswith(IMAGE_TORCH) and not own_torch
        assert "torch==2.7.1" in pins, "the image's torch must be pinned"
    else:
        assert own_torch and torch_file.startswith(TRAINER_ENV)
        assert not [line for line in pins if line.startswith("torch")]


def test_the_projects_requirements_run_in_an_environment_named_by_their_hash(host) -> None:
    python = env(host)["FORJA_PYTHON"]
    folder = python.removesuffix("/bin/python")
    assert folder.startswith("/opt/forja/envs/") and len(folder.rsplit("/", 1)[1]) == 16
    tabulate, torch_file = python_says(host, python,
                                       "import tabulate, torch; print(tabulate.__file__, torch.__file__)")
    assert tabulate.startswith(f"{folder}/lib/python3.10/site-packages/")
    image_or_trainer = IMAGE_TORCH if name(host) == "th4" else TRAINER_ENV
    assert torch_file.startswith(image_or_trainer), "torch is never replaced"
    assert host.file(f"{folder}.requirements.txt").contains("tabulate==0.9.0")
    assert host.run(f"{python} -m pip check").rc == 0


def scenario_vars() -> dict:
    """The variables molecule.yml gives every host of this scenario."""
    scenario = Path(__file__).resolve().parents[1]
    inventory = yaml.safe_load((scenario / "molecule.yml").read_text())["provisioner"]["inventory"]
    return inventory["group_vars"]["all"]


def test_a_bad_requirements_file_stops_before_the_run_and_leaves_nothing(host, tmp_path) -> None:
    """Bad input, on th3 only: a second play with an unresolvable requirements.txt and a new run name."""
    if name(host) != "th3":
        return
    before = host.check_output("ls /opt/forja/envs")
    project = tmp_path / "project"
    project.mkdir()
    (project / "requirements.txt").write_text("no-such-package-forja-molecule==1.0\n")
    eph = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
    instance = next(e for e in yaml.safe_load(Path(os.environ["MOLECULE_INSTANCE_CONFIG"]).read_text())
                    if e["instance"] == "th3")
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"th3": {
        "ansible_host": instance["address"], "ansible_user": instance["user"],
        "ansible_ssh_private_key_file": instance["identity_file"],
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}}}))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{
        "name": "Train with a bad requirements file", "hosts": "all", "become": True, "gather_facts": False,
        "vars": {"trainer_run_config": str(eph / "digits-2node.yaml"), "trainer_run_name": "digits-badreq",
                 "trainer_run_trainer_src": str(eph / "trainer"), "trainer_run_project_dir": str(project),
                 "trainer_run_bundle_cache": str(eph / "bundles"), "trainer_run_wait": False,
                 # molecule.yml's: other pip arguments would make th3 build its environment again
                 "trainer_run_pip_extra_args": scenario_vars()["trainer_run_pip_extra_args"]},
        "roles": ["forja.gpu.trainer_run"]}]))
    repo = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
    run = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory.yml"),
         str(tmp_path / "play.yml")], cwd=repo, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"})
    assert run.returncode != 0
    assert f"{project}/requirements.txt does not install on th3" in run.stdout, run.stdout[-3000:]
    assert "no-such-package-forja-molecule" in run.stdout
    assert host.check_output("ls /opt/forja/envs") == before, "nothing of the bad file may be left"
    assert not host.file("/etc/forja/train/digits-badreq.env").exists


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
    # The converge's start and restarts count towards StartLimitBurst: clear the counter so this start
    # reaches the ExecCondition instead of being refused as 'start-limit-hit' without a word.
    host.run(f"sudo systemctl reset-failed {UNIT}")
    start = host.run(f"sudo systemctl start {UNIT}")
    result = host.check_output(f"systemctl show -p Result --value {UNIT}")
    assert result == "exec-condition", f"{start.stdout}{start.stderr}" + host.run(
        f"sudo systemctl status --no-pager {UNIT}").stdout
    assert host.service(UNIT).is_running is False
    assert host.check_output(stamp) == before
    # What the condition tells the user, from the command itself with the unit's settings: whether
    # journald stores the line of a process that exits at once is systemd's race, not forja's (a CI
    # run once found it missing after 30 s of reading the whole journal; systemd issue 6565).
    condition = host.check_output(f"systemctl show -p ExecCondition --value {UNIT}")
    assert "/usr/local/lib/forja/forja-train-launch --check" in condition, condition
    said = host.run(f"sudo bash -c 'set -a; . /etc/forja/train/{RUN}.env; set +a; "
                    "/usr/local/lib/forja/forja-train-launch --check'")
    assert (said.rc, said.stdout.strip()) == (1, f"forja: run {RUN} already completed"), said


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
    # rank 0 exported the finished model (trainer.export) and the fetch brought it back, intact
    import torch

    from trainer.export import load_model, verify

    model = verify(folder / "model")  # model.json's sha256 against the fetched weights
    assert model["step"] == summary["steps"] and model["checkpoint"] == f"ckpt-{summary['steps']}.pt"
    with torch.no_grad():
        assert load_model(folder / "model")(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


# The role's write tasks: on a converged host a re-run skips every one of them (state.yml compared
# the host in one call), and runs exactly those whose thing drifted.
WRITE_TASKS = (
    "Create the run user", "Create the folders, with their owners and modes", "Copy the bundle to the host",
    "Unpack the bundle", "Install the launcher and the state reader", "Install the training unit template",
    "Copy the run's config", "Write the run spec of the user's command", "Write the run's environment file",
    "Give the run's processes their stop grace", "Enable the training unit so it resumes after a reboot",
    "Start the training unit", "Fetch the results to the controller",
)


def play(playbook: Path, *args: str) -> dict[str, str]:
    """ansible-playbook on the scenario's hosts; returns each trainer_run task's output, by task name."""
    repo = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
    eph = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"])
    inventory = os.environ.get("MOLECULE_INVENTORY_FILE") or str(eph / "inventory" / "ansible_inventory.yml")
    run = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", inventory, str(playbook), *args],
        cwd=repo, capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "ANSIBLE_CONFIG": str(repo / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
             "ANSIBLE_FORCE_COLOR": "0"})  # molecule forces colour for its own runs
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    out = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout)
    blocks = re.split(r"^TASK \[forja\.gpu\.trainer_run : (.+?)\] \**$", out, flags=re.M)
    return {blocks[i]: blocks[i + 1] for i in range(1, len(blocks) - 1, 2)}


def converge_again() -> dict[str, str]:
    """converge.yml once more on both hosts; returns each trainer_run task's output, by task name."""
    tasks = play(Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"]) / "converge.yml")
    assert len(tasks) > 10, list(tasks)
    return tasks


def fetched_now(text: str) -> set[str]:
    """The results a fetch task's output says it copied (its loop labels are paths below the run)."""
    return set(re.findall(r"^changed: \[th3\] => \(item=(.+?)\)$", text, re.M))


def host_sha1(host, path: str) -> str:
    return host.check_output(f"sudo sha1sum {path}").split()[0]


def test_drift_is_repaired_by_the_task_that_owns_it_and_a_clean_rerun_writes_nothing(host) -> None:
    """Issue 13: a deleted file, a loosened folder mode, a disabled unit and a lost local result are
    each found (one host_state call) and repaired by their own task; the completed run stays done;
    then a re-run of the converged hosts skips every write task."""
    if name(host) != "th3":
        return
    stamp = host.check_output(f"sudo stat -c %Y {OUT}/COMPLETED")
    env_before = read(host, f"/etc/forja/train/{RUN}.env")
    host.run_expect([0], " && ".join([
        f"sudo rm /etc/forja/train/{RUN}.env /usr/local/lib/forja/forja-train-state",
        "sudo rm /etc/systemd/system/forja-train@.service",
        "sudo chmod 0755 /etc/forja/train",
        f"sudo systemctl disable {UNIT}"]))
    (RESULTS / "th3" / "summary.json").unlink()
    (RESULTS / "th3" / "metrics.jsonl").write_text("{}\n")  # a local copy someone changed

    tasks = converge_again()
    changed = {task for task, text in tasks.items() if re.search(r"^changed: \[th3", text, re.M)}
    assert {"Create the folders, with their owners and modes", "Install the launcher and the state reader",
            "Install the training unit template", "Write the run's environment file",
            "Enable the training unit so it resumes after a reboot",
            "Fetch the results to the controller"} <= changed, changed
    assert "Start the training unit" not in changed and "Copy the bundle to the host" not in changed
    assert read(host, f"/etc/forja/train/{RUN}.env") == env_before
    assert host.file("/etc/forja/train").mode == 0o750
    assert host.file("/usr/local/lib/forja/forja-train-state").mode == 0o755
    assert host.service(UNIT).is_enabled
    assert host.check_output(f"sudo stat -c %Y {OUT}/COMPLETED") == stamp, "a completed run never restarts"
    assert json.loads((RESULTS / "th3" / "summary.json").read_text())["status"] == "completed"
    # exactly the two results whose local copy was gone or changed came back, as on the host
    assert fetched_now(tasks["Fetch the results to the controller"]) == {"summary.json", "metrics.jsonl"}
    assert hashlib.sha1((RESULTS / "th3" / "metrics.jsonl").read_bytes()).hexdigest() == host_sha1(
        host, f"{OUT}/metrics.jsonl")

    clean = converge_again()
    wrote = {task: text for task, text in clean.items()
             if task in WRITE_TASKS and re.search(r"^(ok|changed): ", text, re.M)}
    assert wrote == {}, f"a re-run of converged hosts ran write tasks: {list(wrote)}"
    # the wait's last poll listed the results: the fetch asked the host nothing more (no find, no listing)
    assert re.search(r"^skipping: \[th3\]", clean["List the run's results with their checksums"], re.M)
    assert "Find the run's results" not in clean


def test_fetching_alone_lists_the_results_in_one_call_and_fetches_only_what_the_controller_lacks(
    host, tmp_path
) -> None:
    """playbooks/train_fetch.yml (forja fetch): no wait before it, so it lists the results itself."""
    if name(host) != "th3":
        return
    repo = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
    args = ("-e", f"forja_hosts=th3 trainer_run_name={RUN} trainer_run_fetch_dir={tmp_path}")
    folder = tmp_path / "th3"

    first = play(repo / "playbooks" / "train_fetch.yml", *args)
    assert re.search(r"^ok: \[th3\]", first["List the run's results with their checksums"], re.M)
    got = fetched_now(first["Fetch the results to the controller"])
    assert {"summary.json", "metrics.jsonl", "model/model.json", "model/model.safetensors"} <= got, got
    assert not [path for path in got if path.startswith("checkpoints/") or ".tmp" in path], got
    assert got == {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}

    again = play(repo / "playbooks" / "train_fetch.yml", *args)
    assert fetched_now(again["Fetch the results to the controller"]) == set()
    assert re.search(r"^skipping: \[th3\]", again["Fetch the results to the controller"], re.M)

    (folder / "model" / "model.json").unlink()
    (folder / "summary.json").write_text("{}")
    repaired = play(repo / "playbooks" / "train_fetch.yml", *args)["Fetch the results to the controller"]
    assert fetched_now(repaired) == {"model/model.json", "summary.json"}
    local = hashlib.sha1((folder / "summary.json").read_bytes()).hexdigest()
    assert local == host_sha1(host, f"{OUT}/summary.json")
