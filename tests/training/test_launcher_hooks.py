"""The user's hooks as forja-train-launch runs them, as systemd runs it (no test host needed).

The real launcher (roles/trainer_run/files/forja-train-launch) with the env file's settings, this
machine's Python as the run's Python, and a run that saves a checkpoint when it is SIGTERMed (what
the trainer and trainer.runlib do) and exits 3. After it: the stop or preemption hook, with the run
contract, after the checkpoint; a hanging hook killed (its whole group) at its timeout and a failing
one logged, neither changing the run's exit status nor holding the stop; and the down hook that
playbooks/teardown.yml runs through `--hook down`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from state_reader import state_reader
from trainer_helpers import launcher_env

from forja import following, runstate
from trainer import exit_codes, run_folder

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "roles" / "trainer_run" / "files" / "forja-train-launch"
pytestmark = pytest.mark.skipif(
    shutil.which("flock") is None or shutil.which("timeout") is None,
    reason="the launcher needs flock and timeout",
)

#: The run: on SIGTERM it saves a checkpoint (its time in it), then exits as preempted.
RUN = """
import os, signal, sys, time
out = os.environ["FORJA_RUN_DIR"]
def save(signum, frame):
    os.makedirs(os.environ["FORJA_CHECKPOINT_DIR"], exist_ok=True)
    time.sleep(0.3)
    with open(os.path.join(os.environ["FORJA_CHECKPOINT_DIR"], "ckpt-1.pt"), "w") as f:
        f.write(str(time.time()))
    sys.exit(3)
signal.signal(signal.SIGTERM, save)
open(os.path.join(out, "started"), "w").close()
while True:
    time.sleep(0.1)
"""

#: A hook that notes what it saw: its event, the run contract, where it ran, when.
NOTE = """#!{python}
import json, os, time
seen = {{k: v for k, v in os.environ.items() if k.startswith("FORJA_")}}
seen["cwd"], seen["time"] = os.getcwd(), time.time()
name = "hook-" + os.environ["FORJA_HOOK_EVENT"] + ".json"
with open(os.path.join(os.environ["FORJA_RUN_DIR"], name), "w") as f:
    json.dump(seen, f)
print("pushed the checkpoint")
"""

#: A hook that never ends, with a child of its own, both noted so the test can see them gone.
HANG = """#!/bin/bash
sleep 600 &
echo "$! $$" >"$FORJA_RUN_DIR/hang.pids"
sleep 600
"""

FAIL = """#!/bin/bash
echo "no credentials for the bucket" >&2
exit 5
"""


def project_with(tmp_path: Path, hooks: dict[str, str]) -> Path:
    """A project folder holding the run and the hook scripts (executable), by file name."""
    project = tmp_path / "project"
    (project / "hooks").mkdir(parents=True)
    (project / "run.py").write_text(RUN)
    for name, text in hooks.items():
        script = project / "hooks" / name
        script.write_text(text.format(python=sys.executable))
        script.chmod(0o755)
    return project


def env_for(tmp_path: Path, project: Path, hooks: dict[str, str], grace: int, timeout: int) -> dict[str, str]:
    """The launcher's environment: what the role's env file (run.env.j2) gives it."""
    return launcher_env(
        tmp_path, "hooked", {"command": ["run.py"]}, project, grace=grace, FORJA_HOOK_TIMEOUT_S=str(timeout),
        **{f"FORJA_HOOK_{event.upper()}": path for event, path in hooks.items()},
    )


def stop_a_run(env: dict[str, str], *, requested: bool = False) -> tuple[int, str, float]:
    """Start the launcher, SIGTERM it once the run is going (as systemd does); its exit status, its
    output and the seconds from the SIGTERM to its end. `requested`: `forja stop` marked the stop."""
    out = Path(env["FORJA_OUT"])
    proc = subprocess.Popen(
        ["bash", str(LAUNCHER)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    while not (out / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    if requested:
        # what roles/trainer_run/tasks/stop.yml leaves before it stops the unit
        (out / run_folder.STOP_REQUESTED).write_text("forja stop\n")
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    said, _ = proc.communicate(timeout=60)
    return proc.returncode, said, time.monotonic() - sent


def hook_log(env: dict[str, str]) -> str:
    return (Path(env["FORJA_OUT"]) / run_folder.HOOK_LOG).read_text()


def test_the_preemption_hook_runs_after_the_checkpoint_with_the_run_contract(tmp_path: Path) -> None:
    hooks = {"preemption": "hooks/note.py", "stop": "hooks/note.py"}
    project = project_with(tmp_path, {"note.py": NOTE})
    env = env_for(tmp_path, project, hooks, grace=20, timeout=10)
    rc, said, _ = stop_a_run(env)
    assert rc == exit_codes.PREEMPTED, said
    out = tmp_path / "out"
    seen = json.loads((out / "hook-preemption.json").read_text())
    saved = float((out / run_folder.CHECKPOINTS_DIR / "ckpt-1.pt").read_text())
    assert seen["time"] > saved, "the checkpoint comes first"
    assert seen["FORJA_HOOK_EVENT"] == "preemption" and not (out / "hook-stop.json").exists()
    assert seen["FORJA_RUN"] == "hooked" and seen["FORJA_RUN_DIR"] == seen["FORJA_OUT"] == str(out)
    assert seen["FORJA_CHECKPOINT_DIR"] == str(out / run_folder.CHECKPOINTS_DIR)
    assert seen["cwd"] == str(project)
    log = hook_log(env)
    assert "preemption hook hooks/note.py started (timeout 10 s)" in log
    assert "pushed the checkpoint" in log and "preemption hook hooks/note.py exited with 0" in log
    assert "forja: preemption hook hooks/note.py exited with 0" in said, "the journal says it too"


def test_a_stop_that_forja_stop_asked_for_runs_the_stop_hook(tmp_path: Path) -> None:
    hooks = {"preemption": "hooks/note.py", "stop": "hooks/note.py"}
    project = project_with(tmp_path, {"note.py": NOTE})
    env = env_for(tmp_path, project, hooks, grace=20, timeout=10)
    rc, said, _ = stop_a_run(env, requested=True)
    assert rc == exit_codes.PREEMPTED, said
    assert json.loads((tmp_path / "out" / "hook-stop.json").read_text())["FORJA_HOOK_EVENT"] == "stop"
    assert not (tmp_path / "out" / "hook-preemption.json").exists()


def test_a_hanging_hook_is_killed_with_its_children_at_its_timeout(tmp_path: Path) -> None:
    project = project_with(tmp_path, {"hang.sh": HANG})
    env = env_for(tmp_path, project, {"preemption": "hooks/hang.sh"}, grace=20, timeout=2)
    rc, said, took = stop_a_run(env)
    assert rc == exit_codes.PREEMPTED, said  # the hook changes nothing of the run's end
    assert took < 10, f"the stop took {took:.1f} s: the hook held it"
    assert "preemption hook hooks/hang.sh timed out after 2 s; killed" in hook_log(env)
    for pid in map(int, (tmp_path / "out" / "hang.pids").read_text().split()):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_hook_never_outlasts_the_stop_grace(tmp_path: Path) -> None:
    """A grace of 2 s leaves the hook at most what the checkpoint did not use, not its 10 s."""
    project = project_with(tmp_path, {"hang.sh": HANG})
    env = env_for(tmp_path, project, {"preemption": "hooks/hang.sh"}, grace=2, timeout=10)
    rc, said, took = stop_a_run(env)
    assert rc == exit_codes.PREEMPTED, said
    assert took < 6, f"the stop took {took:.1f} s, past its 2 s grace"
    ended = r"timed out after ([0-9]+) s; killed|not run: no time left of the 2 s"
    said_in_log = re.search(ended, hook_log(env))
    assert said_in_log is not None and int(said_in_log.group(1) or 0) <= 2, hook_log(env)


def test_the_down_hook_runs_on_its_own_with_the_run_contract(tmp_path: Path) -> None:
    """What playbooks/teardown.yml runs (through systemd-run, with the unit's env file and user)."""
    project = project_with(tmp_path, {"note.py": NOTE})
    env = env_for(tmp_path, project, {"down": "hooks/note.py"}, grace=20, timeout=10)
    (tmp_path / "out").mkdir()
    proc = subprocess.run(["bash", str(LAUNCHER), "--hook", "down"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads((tmp_path / "out" / "hook-down.json").read_text())
    assert seen["FORJA_HOOK_EVENT"] == "down" and seen["FORJA_RUN_DIR"] == str(tmp_path / "out")
    assert "down hook hooks/note.py exited with 0" in hook_log(env)


def test_a_failing_hook_is_logged_and_forja_logs_shows_its_lines(tmp_path: Path) -> None:
    """The run ends as it did; the host's reader (forja-train-state) sends the hook log's end with the
    journal, `forja logs` shows its lines prefixed, and `logs -f` each line once."""
    project = project_with(tmp_path, {"fail.sh": FAIL})
    env = env_for(tmp_path, project, {"preemption": "hooks/fail.sh"}, grace=20, timeout=10)
    rc, said, _ = stop_a_run(env)
    assert rc == exit_codes.PREEMPTED, said
    assert "preemption hook hooks/fail.sh exited with 5" in hook_log(env)
    reader = state_reader()
    conf = {k: v for k, v in env.items() if k.startswith("FORJA_")}
    assert reader.hooks(conf) == {"preemption": "hooks/fail.sh"}
    text, count = reader.hook_log(env["FORJA_OUT"], 50)
    assert count == 3 and "no credentials for the bucket" in text  # started, the hook's line, how it ended
    state = runstate.parse({"forja_train_state": 1, "run": "r", "hook_log": text, "hook_log_lines": count})
    assert state is not None
    shown = following.hook_lines(state.hook_log).splitlines()
    assert len(shown) == 3 and all(line.startswith(following.HOOK_PREFIX) for line in shown)
    assert shown[1] == following.HOOK_PREFIX + "no credentials for the bucket"
    assert following.unseen_hook_lines(state, None) == text, "the first look shows the end it was sent"
    assert following.unseen_hook_lines(state, count) == "", "then only lines written since"
    assert following.unseen_hook_lines(state, count - 1) == text.splitlines(keepends=True)[-1]
