"""The trainer_run role refuses a bad own-script run before anything is sent or installed.

The role's input checks (tasks/validate.yml, with forja_bundle's verify-only walk and the GPU count
from nvidia_facts) are applied by ansible-playbook to a local-connection host, once per case; each
case records the message it failed with, or what the role decided. Nothing here needs a test host:
these checks run on the controller and only read the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.slow  # one play of every case: over 30 s (bench/suite_times.py), not make check

REPO = Path(__file__).resolve().parents[2]

# name -> (role variables, the message's expected words, or None when the inputs are good)
CMD = "trainer_run_command"
CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "missing_script": ({CMD: ["nope.py"]}, "the script nope.py is not a file in the project folder"),
    "no_project": ({CMD: ["train.py"], "trainer_run_project_dir": ""},
                   "(trainer_run_project_dir, which is empty)"),
    "escaping_path": ({CMD: ["../outside.py"]}, "must be a path relative to your project folder"),
    "excluded_script": ({CMD: ["scratch/train.py"], "trainer_run_excludes": ["scratch"]},
                        "project/scratch/train.py: left out by the exclude pattern 'scratch'"),
    "key_script": ({CMD: ["secret.py"]}, "its content is an OpenSSH private key, so it is never sent"),
    "spec_command_a_string": ({"trainer_run_config": "SPEC_STRING"}, "must be a list of non-empty strings"),
    "nothing_to_run": ({"trainer_run_project_dir": ""},
                       "trainer_run_config and trainer_run_command are both empty"),
    "bad_nproc": ({CMD: ["train.py"], "trainer_run_nproc_per_node": "all"},
                  'trainer_run_nproc_per_node ("all") must be auto or a number >= 1'),
    "min_nodes_above_nodes": ({CMD: ["train.py"], "trainer_run_nnodes": 2,
                               "trainer_run_master_addr": "10.0.0.1", "trainer_run_min_nodes": 3},
                              "trainer_run_min_nodes (3) must be 1 to trainer_run_nnodes (2)"),
    "negative_restarts": ({CMD: ["train.py"], "trainer_run_max_restarts": -1},
                          "trainer_run_max_restarts (-1) a number >= 0"),
    "play_lacks_a_node": ({CMD: ["train.py"], "trainer_run_nnodes": 2, "trainer_run_master_addr": "10.0.0.1"},
                          "is node 0 of 2, but the play has 1 such host(s) (play_lacks_a_node): a host "
                          "outside a cluster trains alone; to train several hosts as one run, give them the "
                          "same forja_cluster"),
    "bad_bucket": ({CMD: ["train.py"], "trainer_run_checkpoint_bucket": "gs://Bad Bucket/x"},
                   'trainer_run_checkpoint_bucket: "gs://Bad Bucket/x" must be gs://BUCKET or gs://BUCKET/PREFIX'),
    "replace_with_bucket": ({CMD: ["train.py"], "trainer_run_replaced_as": "train-replaced-1",
                             "trainer_run_checkpoint_bucket": "gs://my-ckpt/runs"},
                            "needs them moved there to the new name first"),
    "replace_with_bucket_moved": ({CMD: ["train.py"], "trainer_run_replaced_as": "train-replaced-1",
                                   "trainer_run_checkpoint_bucket": "gs://my-ckpt/runs",
                                   "trainer_run_replaced_bucket_moved": True}, None),
    "unknown_hook_event": ({CMD: ["train.py"], "trainer_run_hooks": {"preempted": "hooks/push.sh"}},
                           "must map events (stop, preemption, down) to scripts in your project folder"),
    "hook_outside_project": ({CMD: ["train.py"], "trainer_run_hooks": {"stop": "../push.sh"}},
                             'trainer_run_hooks: {"stop": "../push.sh"} must map events'),
    "hook_not_executable": ({CMD: ["train.py"], "trainer_run_hooks": {"down": "hooks/plain.sh"}},
                            "project/hooks/plain.sh: hooks/plain.sh is not executable; make it so (chmod +x "
                            "hooks/plain.sh"),
    "bad_hook_timeout": ({CMD: ["train.py"], "trainer_run_hooks": {"stop": "hooks/push.sh"},
                          "trainer_run_hook_timeout_s": 0}, "trainer_run_hook_timeout_s: 0 must be a number"),
    "bad_queue": ({CMD: ["train.py"], "trainer_run_queue": True, "trainer_run_gpu_memory": "lots"},
                  'trainer_run_gpu_memory ("lots") an amount such as 10GiB'),
    "queue_on_nodes": ({CMD: ["train.py"], "trainer_run_queue": True, "trainer_run_nnodes": 2,
                        "trainer_run_master_addr": "10.0.0.1"},
                       "the queue is one host's, and this run trains on 2"),
    "good_queue": ({CMD: ["train.py"], "trainer_run_queue": True, "trainer_run_gpu_memory": "10 GiB",
                    "trainer_run_queue_priority": -2}, None),
    "good_command": ({CMD: ["train.py", "--steps", "5"], "trainer_run_cpu_procs": 2}, None),
    "good_hooks": ({CMD: ["train.py"],
                    "trainer_run_hooks": {"stop": "hooks/push.sh", "down": "hooks/push.sh"}}, None),
    "good_bucket": ({CMD: ["train.py"], "trainer_run_checkpoint_bucket": "gs://my-ckpt/runs/exp-1"}, None),
    "good_spec": ({"trainer_run_config": "SPEC_GOOD"}, None),
    "command_wins_over_spec": ({"trainer_run_config": "SPEC_GOOD", CMD: ["other.py"]}, None),
}  # fmt: skip


def _project(work: Path) -> Path:
    project = work / "project"
    (project / "scratch").mkdir(parents=True)
    (project / "train.py").write_text("print('training')\n")
    (project / "other.py").write_text("print('other')\n")
    (project / "hooks").mkdir()
    (project / "hooks" / "push.sh").write_text("#!/bin/sh\necho pushed\n")
    (project / "hooks" / "push.sh").chmod(0o755)
    (project / "hooks" / "plain.sh").write_text("#!/bin/sh\necho plain\n")
    (project / "scratch" / "train.py").write_text("print('scratch')\n")
    (project / "secret.py").write_text(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nnot-a-key\n-----END OPENSSH PRIVATE KEY-----\n"
    )
    (work / "spec-string.yaml").write_text(yaml.safe_dump({"command": "python train.py"}))
    (work / "spec-good.yaml").write_text(yaml.safe_dump({"command": ["train.py", "--steps", "7"], "lr": 0.1}))
    return project


def _play(work: Path, name: str, variables: dict[str, Any]) -> dict[str, Any]:
    specs = {"SPEC_STRING": str(work / "spec-string.yaml"), "SPEC_GOOD": str(work / "spec-good.yaml")}
    variables = {k: specs.get(v, v) if isinstance(v, str) else v for k, v in variables.items()}
    return {
        "name": f"Check the inputs of case {name}",
        "hosts": name,
        "gather_facts": False,
        "vars": {
            "trainer_run_project_dir": str(work / "project"),
            "trainer_run_bundle_cache": str(work / "bundles"),
            **variables,
        },
        "tasks": [
            {
                "name": "Apply the role's input checks",
                "block": [
                    {
                        "name": "Check as the role does",
                        "ansible.builtin.include_role": {
                            "name": "forja.gpu.trainer_run",
                            "tasks_from": "validate.yml",
                            "public": True,
                        },
                    },
                    {
                        "name": "Record what the role decided",
                        "ansible.builtin.copy": {
                            "dest": str(work / f"{name}.json"),
                            "mode": "0600",
                            "content": "{{ {'name': trainer_run_name, 'command': trainer_run_command_used,"
                            " 'nproc': trainer_run_nproc_used, 'spec': trainer_run_spec} | to_json }}",
                        },
                    },
                ],
                "rescue": [
                    {
                        "name": "Record the message",
                        "ansible.builtin.copy": {
                            "dest": str(work / f"{name}.json"),
                            "mode": "0600",
                            "content": "{{ {'failed': ansible_failed_result.msg} | to_json }}",
                        },
                    }
                ],
            }
        ],
    }


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    work = tmp_path_factory.mktemp("script-inputs")
    _project(work)
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (work / "inventory.yml").write_text(
        yaml.safe_dump({"all": {"hosts": dict.fromkeys(CASES), "vars": local}})
    )
    (work / "play.yml").write_text(yaml.safe_dump([_play(work, name, v) for name, (v, _) in CASES.items()]))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))},
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CACHE_PLUGIN": "memory",
        "ANSIBLE_LOCALHOST_WARNING": "false",
    }
    playbook = Path(sys.executable).with_name("ansible-playbook")
    run = subprocess.run(
        [str(playbook), "-i", str(work / "inventory.yml"), str(work / "play.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert not (work / "bundles").exists(), "a check wrote a bundle"
    return {name: json.loads((work / f"{name}.json").read_text()) for name in CASES}


@pytest.mark.parametrize("case", [n for n, (_, msg) in CASES.items() if msg is not None])
def test_bad_input_is_refused_with_a_message_naming_the_fix(outcomes: dict, case: str) -> None:
    assert CASES[case][1] in outcomes[case].get("failed", ""), outcomes[case]


def test_a_command_runs_as_many_cpu_processes_as_asked_on_a_host_without_gpu(outcomes: dict) -> None:
    good = outcomes["good_command"]
    assert (good["name"], good["command"], good["nproc"]) == ("train", ["train.py", "--steps", "5"], 2)


def test_a_run_spec_brings_its_command_and_an_explicit_command_wins(outcomes: dict) -> None:
    spec = outcomes["good_spec"]
    assert (spec["name"], spec["command"], spec["spec"]["lr"]) == (
        "spec-good",
        ["train.py", "--steps", "7"],
        0.1,
    )
    assert spec["nproc"] == 1  # auto without a GPU: trainer_run_cpu_procs' default
    assert outcomes["command_wins_over_spec"]["command"] == ["other.py"]


def test_executable_hooks_in_the_project_are_accepted(outcomes: dict) -> None:
    assert "failed" not in outcomes["good_hooks"], outcomes["good_hooks"]


def test_a_checkpoint_bucket_of_the_right_form_is_accepted(outcomes: dict) -> None:
    assert "failed" not in outcomes["good_bucket"] and outcomes["good_bucket"]["command"] == ["train.py"]
    assert "failed" not in outcomes["replace_with_bucket_moved"]  # forja moved the bucket's objects first
