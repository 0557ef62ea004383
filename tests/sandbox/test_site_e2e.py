"""site.yml end to end on the sandbox cloud, as a new user runs it.

From nothing (the sandbox destroyed) to a trained demo fetched to the controller and a Jupyter
that a Colab-like client reaches through a real SSH tunnel; then a second run that changes
nothing, and a teardown that leaves no host, namespace, mount or emulator behind. The first
insert in the default zone is answered with a stock-out, so the play must move to the fallback
zone. The VM is a Spot VM, so the module can end with the preemption drill: Google takes the VM
away mid-training (a simulated maintenance event through the Compute API), `Forja.up()` starts it
again, and the training unit resumes from its checkpoint at boot and finishes; the run history
records the preemption and the work lost. Then the README's next steps through the real `forja`
command: `forja tunnel` (Colab's two paths through it, on the default kernel), `forja status`,
`forja runs`, `forja cost`, and the VM stopped: `forja logs` says so and how to start it, and
`forja tunnel --start` brings it back. The image's PyTorch behind that default kernel is its own
test. Last, the example project (examples/own-loop: its own model, loop and requirements.txt)
through `forja train --script`: preempted mid-run, it resumes from its own checkpoint, and a
second run installs nothing. This test resets the machine's sandbox (it is the same one
`make sandbox` uses). Like `make sandbox`, it starts the sandbox service itself and names the
sandbox's inventory on every command: no inventory starts a daemon, and the checkout has no
default inventory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import playout
import pytest
import requests
import testsandbox
import torch
import yaml
from renamed_tree import PREFIX, renamed_copy

from forja import contract, cost_report
from forja import format as fmt
from forja.api import Forja
from forja.history import History
from forja_sandbox import colab, iap, service, testhosts
from forja_sandbox.tunnel import port_is_free, ssh_tunnel
from trainer import run_folder

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
#: Named on every command, as the README's walk does (`make sandbox`, then FORJA_INVENTORY): the
#: checkout has no default inventory. It is inventory/sandbox pointed at the test run's own sandbox
#: (tests/testsandbox.py), never the one `make sandbox` made.
INVENTORY = testsandbox.INVENTORY
STOCK_OUT = [{"method": "instances.insert", "error": "ZONE_RESOURCE_POOL_EXHAUSTED",
              "zone": "us-east1-d", "times": 1}]
SPOT = ("-e", "gcp_instance_spot=true")  # every site run of this module: the drill needs a Spot VM


def _playbook(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(INVENTORY), *args]
    proc = subprocess.run(argv, cwd=ROOT,
                          capture_output=True, text=True, env=env or dict(os.environ), timeout=2400,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return proc


def _compute(method: str, path: str, body: dict | None = None) -> dict:
    """One Compute API call to the sandbox, authorised with the sandbox's own service-account key."""
    import google.auth.transport.requests
    from google.oauth2 import service_account

    endpoint = service.ensure_running()
    creds = service_account.Credentials.from_service_account_file(
        endpoint["credentials_file"], scopes=["https://www.googleapis.com/auth/compute"])
    creds.refresh(google.auth.transport.requests.Request())
    resp = requests.request(method, f"{endpoint['api_url']}projects/{endpoint['project']}/{path}",
                            headers={"Authorization": f"Bearer {creds.token}"}, json=body, timeout=60)
    resp.raise_for_status()
    return resp.json()


def _done(operation: dict) -> None:
    """Wait until a global operation (a firewall change) is DONE, as gcloud does."""
    deadline = time.monotonic() + 60
    while operation.get("status") != "DONE":
        assert time.monotonic() < deadline, operation
        time.sleep(0.2)
        operation = _compute("GET", f"global/operations/{operation['name']}")
    assert "error" not in operation, operation


def _instances() -> list[dict]:
    """The sandbox's instances, read through the Compute API."""
    items = _compute("GET", "aggregated/instances")["items"]
    return [i for scope in items.values() for i in scope.get("instances", [])]


def _preempt(vm: dict[str, Any]) -> None:
    """Google's maintenance event on the Spot VM, then wait until the Compute API says TERMINATED."""
    zone = vm["zone"].rsplit("/", 1)[-1]
    _compute("POST", f"zones/{zone}/instances/{vm['name']}/simulateMaintenanceEvent")
    deadline = time.monotonic() + 600  # safety nets, far past what a busy machine needs
    while _instances()[0]["status"] != "TERMINATED":
        assert time.monotonic() < deadline, "the Spot VM was not preempted within 600 s"
        time.sleep(1)


def _address(vm: dict) -> str:
    return vm["networkInterfaces"][0]["accessConfigs"][0]["natIP"]


def _through_iap(vm: dict) -> str:
    """The ProxyCommand Ansible uses for the VM: the sandbox's firewall admits SSH from IAP only."""
    return iap.proxy_command(vm["name"], vm["zone"].rsplit("/", 1)[-1], service.PROJECT)


def _on_host(vm: dict, command: str, key: Path | None = None, user: str = "ansible") -> str:
    ssh = ["ssh", "-i", str(key or testhosts.key_path()), *testhosts.SSH_OPTIONS, "-o", "ConnectTimeout=5",
           "-o", f"ProxyCommand={_through_iap(vm)}", f"{user}@{_address(vm)}", command]
    return subprocess.run(ssh, capture_output=True, text=True, timeout=30, check=False).stdout


@pytest.fixture(scope="module")
def first_run(sandbox_cloud: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """site.yml on the test run's sandbox, whose first insert in us-east1-d meets a stock-out (a fault
    added to the running emulator: it is used up by that insert)."""
    assert _instances() == [], "the test sandbox has VMs before site.yml: an earlier test left them"
    for fault in STOCK_OUT:
        service.inject_fault(**fault)
    return _playbook("site.yml", *SPOT)


def test_stock_out_moves_the_vm_to_the_fallback_zone(first_run: subprocess.CompletedProcess[str]) -> None:
    (vm,) = _instances()
    assert vm["name"] == "forja-l4"
    assert vm["zone"].endswith("/zones/us-east1-b"), vm["zone"]
    assert vm["status"] == "RUNNING"
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in first_run.stdout + first_run.stderr


def test_the_demo_trained_and_its_results_were_fetched(first_run: subprocess.CompletedProcess[str]) -> None:
    results = ROOT / "results" / "digits" / "forja-l4"
    summary = json.loads((results / run_folder.SUMMARY).read_text())
    assert summary["status"] == "completed"
    assert summary["accuracy"] >= 0.85
    assert (results / run_folder.METRICS).stat().st_size > 0
    assert list((results / run_folder.PLOTS_DIR).glob("*.png"))
    # the model without forja's checkpoint format came back too, and rebuilds here
    from trainer.export import load_model

    model = load_model(results / run_folder.MODEL_DIR)
    assert json.loads((results / run_folder.MODEL_DIR / "model.json").read_text())["step"] == summary["steps"]
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert "Training: completed" in first_run.stdout
    assert "Colab: open the tunnel with: ssh -N -L 8888:127.0.0.1:8888" in first_run.stdout


def test_colab_reaches_the_provisioned_jupyter_through_a_tunnel(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    (vm,) = _instances()
    assert TOKEN_FILE.stat().st_mode & 0o077 == 0, "the fetched token must be readable by its owner only"
    token = TOKEN_FILE.read_text()
    with ssh_tunnel(_address(vm), "ansible", testhosts.key_path(), 8888, 8888, proxy_command=_through_iap(vm),
                    strict_host_key_checking="no", known_hosts_file="/dev/null") as tunnel:
        assert colab.run_via_http_over_ws(tunnel.base_url, token, "print(1+1)").strip() == "2"
        assert colab.run_via_direct(tunnel.base_url, token, "print(1+1)").strip() == "2"
        with pytest.raises(colab.ColabRefused):
            colab.run_via_direct(tunnel.base_url, "wrong-token", "print(1)")


def _assert_nothing_changed(proc: subprocess.CompletedProcess[str]) -> None:
    recap = playout.recap(proc.stdout)
    assert recap, "no PLAY RECAP found"
    assert {host: stats["changed"] for host, stats in recap.items()} == dict.fromkeys(recap, 0), (
        playout.changed_tasks(proc.stdout))


def test_a_second_run_changes_nothing(first_run: subprocess.CompletedProcess[str]) -> None:
    _assert_nothing_changed(_playbook("site.yml", *SPOT))


def test_a_second_run_with_the_mitogen_strategy_changes_nothing(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    """The opt-in fast strategy (plugins/strategy/mitogen_linear.py) sees the same converged state.

    An unknown strategy name fails the play, so a pass means Mitogen's strategy drove the run.
    """
    env = dict(os.environ, ANSIBLE_STRATEGY="forja.gpu.mitogen_linear")
    _assert_nothing_changed(_playbook("site.yml", *SPOT, env=env))


FORJA = str(Path(sys.executable).with_name("forja"))
TOKEN_FILE = testsandbox.tokens() / "forja-l4.jupyter-token"  # the test sandbox's, not the user's
#: The first cell a researcher runs in Colab: which interpreter, and does the image's PyTorch load.
WHICH_PYTHON = (
    "import sys\nprint('python', sys.executable)\n"
    "try:\n    import torch\n    print('torch', torch.__version__)\n"
    "except ImportError as exc:\n    print('no torch:', exc)\n"
)


def _forja(*args: str, timeout: int = 900, cwd: Path = ROOT,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed `forja` command, run as the README shows it after `make sandbox`: with
    FORJA_INVENTORY naming the sandbox's inventory."""
    return subprocess.run([FORJA, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False, env=dict(env or os.environ, FORJA_INVENTORY=str(INVENTORY)))


@contextlib.contextmanager
def _forja_tunnel(*options: str, start: bool = False, timeout_s: float = 600, port: int = 8888,
                  cwd: Path = ROOT, env: dict[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """`forja [OPTIONS] tunnel [--start]`, left running as a user leaves it; yields the Colab base URL
    (on `port`, the port the host's Jupyter serves) and what it printed so far; Ctrl-C (SIGINT)
    closes it at the end, as a user does."""
    argv = [FORJA, *options, "tunnel", *(["--start"] if start else [])]
    if not port_is_free(port):
        holders = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
        pytest.fail(f"127.0.0.1:{port} is taken before `forja tunnel` starts: {holders}")
    with tempfile.TemporaryFile(mode="w+") as log:
        # its own process group, as a terminal's foreground job: Ctrl-C reaches forja and its ssh
        proc = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True,
                                env=dict(env or os.environ, FORJA_INVENTORY=str(INVENTORY)))
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                assert proc.poll() is None, f"forja tunnel exited {proc.returncode}: {_read(log)}"
                assert time.monotonic() < deadline, f"the tunnel did not open: {_read(log)}"
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                time.sleep(0.2)
            yield f"http://localhost:{port}", _read(log)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the whole group may have ended already
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            # a tunnel left open would answer the next test's connects
            _wait_for(lambda: port_is_free(port), f"127.0.0.1:{port} freed after the tunnel closed", 30)


def _read(log: IO[str]) -> str:
    log.seek(0)
    return log.read()


def test_the_readme_walk_through_the_forja_command(first_run: subprocess.CompletedProcess[str]) -> None:
    """After site.yml, the README's next commands, through the real `forja` CLI: tunnel (both Colab
    paths, the default kernel), status, runs, cost; then the VM stopped: `forja logs` says so, since
    when and how to start it, and `forja tunnel --start` starts it and opens the tunnel again."""
    (vm,) = _instances()
    token = TOKEN_FILE.read_text().strip()
    with _forja_tunnel() as (url, printed):
        assert f"ansible@{_address(vm)}" in printed and "__ansible_unsafe" not in printed, printed
        # the line people paste into a shell: quoted, so the IAP ProxyCommand stays one option
        (line,) = [x for x in printed.splitlines() if x.startswith("tunnel: ")]
        argv = shlex.split(line.removeprefix("tunnel: "))
        assert argv[0] == "ssh" and argv[-1] == f"ansible@{_address(vm)}", argv
        proxy = [word for word in argv if word.startswith("ProxyCommand=")]
        assert len(proxy) == 1 and proxy[0].endswith(_through_iap(vm).split(" ", 1)[1]), argv
        assert "paste into Colab" in printed and "http://localhost:8888/?token=" in printed
        for run_cell in (colab.run_via_http_over_ws, colab.run_via_direct):
            said = run_cell(url, token, WHICH_PYTHON, timeout_s=120)
            assert re.search(r"^python /\S+python", said, flags=re.M), said

    status = _forja("--json", "status")
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    assert ("digits", "completed") in {(s["run"], s["status"]) for s in json.loads(status.stdout)}
    runs = _forja("--json", "runs")
    assert runs.returncode == 0, runs.stdout[-2000:] + runs.stderr[-2000:]
    # site.yml's train play recorded the demo run in the history that `forja runs` lists
    listed = {(r["run_id"], r["status"]) for r in json.loads(runs.stdout)}
    assert ("digits", "completed") in listed, runs.stdout
    # one cost per run (docs/cost-definition.md): site.yml's summary printed the figure `forja runs` shows
    (digits,) = [r for r in json.loads(runs.stdout) if r["run_id"] == "digits"]
    assert f"cost {fmt.money(digits['cost_usd'])} (of which training" in first_run.stdout, digits
    cost = _forja("--json", "cost")
    assert cost.returncode == 0, cost.stdout[-2000:] + cost.stderr[-2000:]
    (line,) = json.loads(cost.stdout)["instances"]
    assert (line["name"], line["zone"], line["status"], line["spot"]) == (
        "forja-l4", "us-east1-b", "RUNNING", True)
    assert line["uptime_s"] > 0 and line["usd_per_hour"] > 0

    down = _forja(*SPOT, "down")
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    (vm,) = _instances()
    assert vm["status"] == "TERMINATED"
    logs = _forja("logs", "digits")
    assert logs.returncode == 6, logs.stdout[-2000:] + logs.stderr[-2000:]
    said = " ".join(logs.stderr.split())
    assert "host forja-l4 is stopped (status TERMINATED since" in said and "forja up" in said, said
    assert "unreachable" not in said and "Connection refused" not in said, said
    error = json.loads(_forja("--json", "logs", "digits").stdout)
    assert error["error"] == "HostStopped" and error["since"].startswith(vm["lastStopTimestamp"][:10])
    refused = _forja("tunnel")
    assert refused.returncode == 6 and "forja tunnel --start" in " ".join(refused.stderr.split())

    with _forja_tunnel(*SPOT, start=True) as (url, printed):
        assert "forja-l4 is TERMINATED: starting it" in printed, printed
        _wait_for_jupyter(url, token)
        assert colab.run_via_direct(url, token, "print(6*7)", timeout_s=120).strip() == "42"
    (vm,) = _instances()
    assert vm["status"] == "RUNNING"


LIVE_RUN = "live-e2e"
SHOTS = ROOT / "results" / "ui"


def _wait_for(check: Any, what: str, timeout_s: float = 180) -> Any:
    """Poll ``check()`` until it returns something true; the assertion names what never came."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):
            if found := check():
                return found
        assert time.monotonic() < deadline, f"{what} did not come within {timeout_s:.0f} s"
        time.sleep(0.5)


def test_data_in_and_a_live_run_watched_through_the_tunnel(
    first_run: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    """Issue 16 on the sandbox as a user does it: a sharded dataset pushed to the bucket, staged on
    the VM's disk, and trained on both ways (streamed from the bucket, read from the disk); then a
    long run's live metrics through `forja tunnel` (scraped twice: the step rises), `forja top`, and
    `forja ui` in headless Chromium with the step rising on screen; `forja cost --run` prices a run."""
    from forja import live

    shards = tmp_path / "digits-shards"
    wrote = subprocess.run([sys.executable, "-m", "trainer.shards", "write", str(shards), "--demo", "digits",
                            "--row-group-mb", "0.05"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           check=False)  # fmt: skip
    assert wrote.returncode == 0, wrote.stdout[-2000:] + wrote.stderr[-2000:]
    pushed = _forja("--json", "data", "push", str(shards), "--name", "digits-shards")
    assert pushed.returncode == 0, pushed.stdout[-2000:] + pushed.stderr[-2000:]
    again = _forja("--json", "data", "push", str(shards), "--name", "digits-shards")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert json.loads(again.stdout)["uploaded_files"] == 0, again.stdout  # content-addressed: nothing new
    staged = _playbook("playbooks/data.yml", "-e", "dataset_name=digits-shards")
    assert staged.returncode == 0, staged.stdout[-3000:]
    (vm,) = _instances()
    assert "train" in _on_host(vm, "ls /var/lib/forja/data/digits-shards")

    project = tmp_path / "project"
    project.mkdir()
    base = yaml.safe_load((ROOT / "trainer" / "configs" / "digits_shards.yaml").read_text())
    sources = {"streamed": "gs://forja-sandbox-checkpoints/datasets/digits-shards",
               "staged": "/var/lib/forja/data/digits-shards"}
    for name, source in sources.items():
        config = project / f"{name}.yaml"
        config.write_text(yaml.safe_dump({**base, "steps": 60, "out_dir": f"runs/{name}",
                                          "data_args": {**base["data_args"], "source": source}}))
        trained = _forja("--json", "train", str(config), "--project", str(project),
                         "--name", f"shards-{name}", cwd=project)  # results under project/forja-runs
        assert trained.returncode == 0, f"{name}: " + trained.stdout[-3000:] + trained.stderr[-2000:]
        assert json.loads(trained.stdout)["summary"]["status"] == "completed", trained.stdout[-2000:]

    config = project / "long.yaml"
    digits = yaml.safe_load((ROOT / "trainer" / "configs" / "digits.yaml").read_text())
    config.write_text(yaml.safe_dump({**digits, "steps": 200000, "log_every_steps": 20,
                                      "out_dir": f"runs/{LIVE_RUN}"}))
    sent = _forja("train", str(config), "--project", str(project), "--name", LIVE_RUN, "--detach",
                  cwd=project)
    assert sent.returncode == 0, sent.stdout[-3000:] + sent.stderr[-2000:]
    ui = None
    try:
        with _forja_tunnel() as (_url, printed):
            assert f"-L {live.metrics_ports()[0]}:127.0.0.1:{live.metrics_ports()[0]}" in printed, printed
            url = live.live_url(live.metrics_ports()[0])
            first = _wait_for(lambda: (s := live.scrape(url)).step and s, "a scrape with a step")
            assert first.run == LIVE_RUN and first.phase == "train"
            later = _wait_for(lambda: (s := live.scrape(url)).step > first.step and s, "a later step", 60)
            assert later.step > first.step and later.loss is not None
            top = _forja("top", "--once", LIVE_RUN)
            assert top.returncode == 0 and LIVE_RUN in top.stdout, top.stdout[-2000:] + top.stderr[-2000:]

            log = tmp_path / "ui.log"
            ui = subprocess.Popen([FORJA, "ui", "--port", "0"], cwd=project, stdout=log.open("wb"),
                                  stderr=subprocess.STDOUT,
                                  env=dict(os.environ, FORJA_INVENTORY=str(INVENTORY)))
            found = _wait_for(lambda: re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", log.read_text()),
                              "forja ui's URL", 60)
            # without the token it answers 401: that it answers at all is what is awaited here
            _wait_for(lambda: requests.get(found.group(1), timeout=2).status_code, "forja ui answering", 30)
            from playwright.sync_api import sync_playwright

            chromium = shutil.which("chromium") or shutil.which("chromium-browser")
            assert chromium, "Debian's chromium (make setup installs it)"
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1400, "height": 1300})
                page.goto(f"{found.group(1)}?token={found.group(2)}")
                step = "parseInt(document.getElementById('live-step').textContent.replace(/,/g, ''))"
                page.wait_for_function(f"() => {step} > 0", timeout=60_000)
                shown = int(page.text_content("#live-step").split("/")[0].replace(",", ""))
                page.wait_for_function(f"() => {step} > {shown}", timeout=60_000)
                assert LIVE_RUN in page.text_content("#runs")
                SHOTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(SHOTS / "sandbox-live-run.png"), full_page=True)
                browser.close()
    finally:
        if ui is not None:
            ui.send_signal(signal.SIGINT)
            try:
                ui.wait(timeout=15)
            except subprocess.TimeoutExpired:
                ui.kill()
        stopped = _forja("stop", LIVE_RUN)
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    # the role left its stop request before the SIGTERM: the trainer counts a stop, not a preemption
    (vm,) = _instances()
    said = _on_host(vm, f"sudo grep -h '\"preempt\"' /var/lib/forja/runs/{LIVE_RUN}/{run_folder.EVENTS}")
    assert [json.loads(line).get("requested_by") for line in said.splitlines()] == ["forja stop"], said
    priced = _forja("--json", "cost", "--run", "shards-streamed", cwd=project)
    assert priced.returncode == 0, priced.stdout[-2000:] + priced.stderr[-2000:]
    assert json.loads(priced.stdout)["cost_usd"] > 0, priced.stdout


MOVED_PORT = 18890


def _autostop_config(vm: dict[str, Any]) -> dict[str, Any]:
    return json.loads(_on_host(vm, "sudo cat /etc/forja/autostop.json"))


def test_forja_tunnel_follows_a_jupyter_port_moved_with_e(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    """`forja -e host_contract_jupyter_port=N configure` moves Jupyter and the autostop agent that
    watches it; a plain `forja tunnel` (no -e) asks the host, opens N at both ends and Colab runs a
    cell through it; `forja configure` moves everything back."""
    token = TOKEN_FILE.read_text().strip()
    moved = _forja(*SPOT, "-e", f"host_contract_jupyter_port={MOVED_PORT}", "configure")
    assert moved.returncode == 0, moved.stdout[-2000:] + moved.stderr[-2000:]
    try:
        (vm,) = _instances()
        assert _autostop_config(vm)["jupyter_url"] == f"http://127.0.0.1:{MOVED_PORT}"
        with _forja_tunnel(port=MOVED_PORT) as (url, printed):
            assert f"http://localhost:{MOVED_PORT}/?token=" in printed, printed
            assert f"-L {MOVED_PORT}:127.0.0.1:{MOVED_PORT}" in printed, printed
            _wait_for_jupyter(url, token)
            assert colab.run_via_direct(url, token, "print(3*3)", timeout_s=120).strip() == "9"
    finally:
        back = _forja(*SPOT, "configure")
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
    assert _autostop_config(vm)["jupyter_url"] == "http://127.0.0.1:8888"


def test_each_ssh_path_reaches_the_vm_and_a_path_the_rules_refuse_is_named(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    """Issue 14: the firewall rule and Ansible's path always agree, and the sandbox's hosts enforce
    the rules. direct: the rule admits this machine's detected address only, so IAP's range no longer
    reaches the VM, and Colab's tunnel goes straight to it; own_rule: forja drops its rule and checks
    the user's; without the user's rule, `forja up` fails before connecting, naming the path and the
    rules; iap again, and the VM is reached through the IAP stand-in."""
    token = TOKEN_FILE.read_text().strip()
    bridge = f"{testhosts.net_prefix()}.1"
    direct, own = ("-e", "gcp_instance_ssh_mode=direct"), ("-e", "gcp_instance_ssh_mode=own_rule")
    try:
        up = _forja(*SPOT, *direct, "up")
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        assert _compute("GET", "global/firewalls/forja-allow-ssh")["sourceRanges"] == [f"{bridge}/32"]
        (vm,) = _instances()
        assert "through-iap" not in _on_host(vm, "echo through-iap"), "IAP's range is not admitted now"
        with _forja_tunnel(*direct) as (url, printed):
            assert "ProxyCommand" not in printed and f"ansible@{_address(vm)}" in printed, printed
            assert colab.run_via_direct(url, token, "print(6*7)", timeout_s=120).strip() == "42"

        _done(_compute("POST", "global/firewalls", {
            "name": "my-ssh", "network": "global/networks/default", "sourceRanges": [f"{bridge}/32"],
            "targetTags": ["forja-ssh"], "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}]}))
        up = _forja(*SPOT, *own, "up")
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        names = {r["name"] for r in _compute("GET", "global/firewalls").get("items", [])}
        assert names == {"my-ssh"}, "own_rule: forja keeps no rule of its own"
        status = _forja(*own, "--json", "status")
        assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]

        _done(_compute("DELETE", "global/firewalls/my-ssh"))
        refused = _forja(*SPOT, *own, "up")
        said = " ".join((refused.stdout + refused.stderr).split())
        assert refused.returncode != 0, said[-3000:]
        assert f"refuses tcp:22 from {bridge} (SSH path: own_rule)" in said, said[-3000:]
        assert "no rule admits it" in said and "gcp_instance_ssh_mode" in said, said[-3000:]
    finally:
        back = _forja(*SPOT, "up")
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
    assert _compute("GET", "global/firewalls/forja-allow-ssh")["sourceRanges"] == ["35.235.240.0/20"]
    assert _on_host(vm, "echo through-iap").strip() == "through-iap"


def test_a_new_key_in_metadata_grants_access_and_the_old_one_loses_it(
    first_run: subprocess.CompletedProcess[str], tmp_path: Path,
) -> None:
    """Issue 14: keys reach the VM only through its ssh-keys metadata, read by the guest agent
    (the sandbox's stand-in): `forja up` with another key replaces the metadata line, the new key
    logs in and the old one no longer does; the default key restores access."""
    new_key = tmp_path / "keys" / "id_new"
    try:
        up = _forja(*SPOT, "-e", f"gcp_instance_ssh_key_file={new_key}", "up")
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        assert new_key.stat().st_mode & 0o777 == 0o600, "forja created the key the user lacked"
        (vm,) = _instances()
        assert _on_host(vm, "echo new", key=new_key).strip() == "new"
        deadline = time.monotonic() + 60
        while _on_host(vm, "echo old").strip() == "old":
            assert time.monotonic() < deadline, "the old key still logs in a minute after it left metadata"
            time.sleep(1)
    finally:
        back = _forja(*SPOT, "up")
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
    # the guest agent applies metadata on its own poll, after `forja up` returned (once, under load,
    # the first try came before it)
    _wait_for(lambda: _on_host(vm, "echo old").strip() == "old", "the old key logging in again", 60)


def test_os_login_reaches_the_vm_as_the_profiles_user(first_run: subprocess.CompletedProcess[str]) -> None:
    """Issue 14: OS Login when the user chooses it. The key goes on the service account's OS Login
    profile, the VM gets enable-oslogin=TRUE (its guest then ignores ssh-keys metadata), and forja
    works as the profile's POSIX user, with sudo. Back to ssh-keys, `ansible` logs in again. (As on
    GCE, keys the agent wrote before OS Login stay in their authorized_keys: the agent stops managing
    them, it does not remove them.)"""
    from forja_sandbox.compute_emulator import oslogin

    account = json.loads(Path(service.endpoint()["credentials_file"]).read_text())["client_email"]
    user = oslogin.posix_username(account)
    os_login = ("-e", "gcp_instance_ssh_os_login=true", "-e", f"gcp_instance_ssh_user={user}")
    try:
        up = _forja(*SPOT, *os_login, "up")
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        status = _forja(*os_login, "--json", "status")
        assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
        assert "digits" in {s["run"] for s in json.loads(status.stdout)}
        (vm,) = _instances()
        assert _on_host(vm, "whoami; sudo -n true && echo root-ok", user=user).split() == [user, "root-ok"]
    finally:
        back = _forja(*SPOT, "up")
    assert back.returncode == 0, back.stdout[-2000:] + back.stderr[-2000:]
    # the guest agent applies metadata on its own poll, after `forja up` returned (once, under load,
    # the first try came before it)
    _wait_for(lambda: _on_host(vm, "echo old").strip() == "old", "the old key logging in again", 60)


#: Runs one playbook of the tree FORJA_ROOT names through forja's runner; prints what was published
#: and every task that started.
PUBLISHED = """
import json, sys
from forja.events import TaskStarted
from forja.runner import PlaybookRun, run
tasks = []
result = run(PlaybookRun(playbook=sys.argv[1], inventory=sys.argv[2], extravars=json.loads(sys.argv[3]),
                         host_key_checking=False),
             on_event=lambda e: tasks.append(e.task) if isinstance(e, TaskStarted) else None)
print(json.dumps({"rc": result.rc, "artifact_data": result.artifact_data, "tasks": tasks}))
"""


def _published(tree: Path, env: dict[str, str], playbook: str, extravars: dict[str, Any]) -> dict[str, Any]:
    """What `playbook` of the renamed ``tree`` published, run through forja's own runner; every task
    that ran must be the copy's (renamed), not only the ones forja happens to read."""
    argv = [sys.executable, "-c", PUBLISHED, playbook, str(INVENTORY), json.dumps(extravars)]
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rc"] == 0, str(out)[-3000:]
    # Ansible's own implicit tasks (facts, argument specs) and handlers keep their names.
    handlers = {h["name"] for f in tree.glob("roles/*/handlers/*.yml")
                for h in yaml.safe_load(f.read_text()) or []}
    ran = [t for t in out["tasks"] if t != "Gathering Facts" and t not in handlers
           and not t.startswith("Validating arguments against arg spec")]
    assert ran and all(t.startswith(PREFIX) for t in ran), f"tasks not of the renamed copy: {ran}"
    return out["artifact_data"]


def test_a_tree_whose_tasks_are_all_renamed_still_drives_the_sandbox(
    first_run: subprocess.CompletedProcess[str], tmp_path: Path,
) -> None:
    """Issue 13: forja reads what the roles publish, never a task's name. In a copy of the checkout
    whose every role and play task is renamed (FORJA_ROOT), `forja status`, `forja train` and
    `forja tunnel` still work on the sandbox, and what jupyter.yml and train_status.yml publish
    still parses, field by field, as forja's models."""
    tree = renamed_copy(tmp_path / "tree")
    env = {**os.environ, "FORJA_ROOT": str(tree), "FORJA_HOME": str(tmp_path / "home"),
           "ANSIBLE_CONFIG": str(tree / "ansible.cfg")}
    status = _forja("--json", "status", cwd=tree, env=env)
    assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
    assert ("digits", "completed") in {(s["run"], s["status"]) for s in json.loads(status.stdout)}
    config = yaml.safe_load((tree / "trainer" / "configs" / "digits.yaml").read_text())
    config.update(steps=60, log_every_steps=20)
    (tmp_path / "renamed.yaml").write_text(yaml.safe_dump(config))
    trained = _forja(*SPOT, "train", str(tmp_path / "renamed.yaml"), "--name", "renamed", cwd=tree, env=env)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-2000:]
    said = " ".join(trained.stderr.split())  # the announcements, recognised by their result key
    assert "Sending" in said and "PyTorch" in said and "renamed completed on forja-l4" in said, said[-3000:]
    after = _forja("--json", "status", "renamed", cwd=tree, env=env)
    assert [(r["run"], r["status"]) for r in json.loads(after.stdout)] == [("renamed", "completed")], (
        after.stdout[-2000:] + after.stderr[-2000:])
    token = TOKEN_FILE.read_text().strip()
    with _forja_tunnel(cwd=tree, env=env) as (url, printed):
        assert "http://localhost:8888/?token=" in printed, printed
        assert colab.run_via_direct(url, token, "print(5*5)", timeout_s=120).strip() == "25"

    # The connection the renamed jupyter.yml publishes, field by field.
    (vm,) = _instances()
    configured = _published(tree, env, "jupyter.yml", {})
    facts = contract.read_stats(configured).hosts["forja-l4"]
    assert facts.contract_version == contract.CONTRACT_VERSION and facts.runs == []  # trainer_run's alone
    conn = facts.jupyter
    assert conn is not None and conn.port == 8888
    assert conn.argv[:3] == ["ssh", "-N", "-L"] and conn.argv[3] == "8888:127.0.0.1:8888"
    assert conn.argv[-1] == f"ansible@{_address(vm)}"
    assert conn.colab_url_template == "http://localhost:8888/?token=<token>"
    assert conn.token_file == "/var/lib/forja/jupyter/token" and conn.local_token_file == str(TOKEN_FILE)
    assert len(token) >= 32 and token not in json.dumps(configured)
    # The run state documents the renamed train_status.yml publishes.
    published = _published(tree, env, "train_status.yml", {"trainer_run_status_runs": ["renamed"]})
    ((host, state),) = contract.read_stats(published).runs
    assert (host, state.run, state.status, state.final) == ("forja-l4", "renamed", "completed", True)
    assert state.step == 60 and state.summary is not None and state.summary["steps"] == 60
    assert state.loss is not None


def test_a_vm_that_autostop_stopped_says_why_while_it_is_stopped(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    """The issue's morning: autostop powered the idle VM off. The agent installed by site.yml (with
    a private copy of its config: no idle window, no boot grace) decides and powers the guest off;
    `forja logs` then says stopped, since when and autostop's reason, read while the VM is down."""
    (vm,) = _instances()
    private = "/root/autostop-e2e.json"
    edit = ("import json; c = json.load(open('/etc/forja/autostop.json')); "
            "c.update(idle_minutes=0.01, boot_grace_minutes=0, dry_run=False, "
            "state_dir='/var/lib/forja/autostop-e2e'); json.dump(c, open('/root/autostop-e2e.json', 'w'))")
    agent = f"python3 /usr/local/lib/forja/forja_autostop.py --config {private}"
    # The first run starts the idle clock; the second, a moment later, stops the VM (in the
    # background, so that this SSH session is not what the poweroff ends).
    _on_host(vm, f"sudo python3 -c {shlex.quote(edit)} && sudo chmod 600 {private} && sudo {agent} "
                           f"&& sleep 2 && sudo systemd-run --no-block {agent}")
    deadline = time.monotonic() + 600
    while (vm := _instances()[0])["status"] != "TERMINATED":
        assert time.monotonic() < deadline, f"autostop did not stop the VM: {vm['status']}"
        time.sleep(1)
    logs = _forja("--json", "logs", "digits")
    assert logs.returncode == 6, logs.stdout[-2000:] + logs.stderr[-2000:]
    error = json.loads(logs.stdout)
    assert error["error"] == "HostStopped" and error["since"].startswith(vm["lastStopTimestamp"][:10])
    assert error["why"].startswith("autostop stopped it (") and "idle for" in error["why"], error
    up = _forja(*SPOT, "up")
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    assert _instances()[0]["status"] == "RUNNING"


def _wait_for_jupyter(url: str, token: str, timeout_s: float = 180) -> None:
    """Right after a start, ssh forwards the port before Jupyter listens on the VM: wait for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/api/status", params={"token": token}, timeout=5).status_code == 200:
                return
        assert time.monotonic() < deadline, f"Jupyter did not answer through the tunnel within {timeout_s} s"
        time.sleep(1)


#: A researcher's first real cells: PyTorch trains a few steps on the default kernel; then a package
#: of their own, installed from the notebook, imports (and still does after a stop and start).
TRAIN_A_FEW_STEPS = (
    "import sys, torch\n"
    "torch.manual_seed(0)\n"
    "x = torch.randn(64, 3); y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1\n"
    "model = torch.nn.Linear(3, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "losses = []\n"
    "for _ in range(20):\n"
    "    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)\n"
    "    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())\n"
    "print('python', sys.executable)\n"
    "print('torch', torch.__version__, 'first', round(losses[0], 4), 'last', round(losses[-1], 4))\n"
)
#: Small, pure Python, no dependencies, not part of Jupyter's or PyTorch's own environment.
PIP_PACKAGE = "inflection==0.5.1"
PIP_IMPORT = "import inflection; print('pip', inflection.underscore('ForjaRun'))"


def test_the_default_kernel_imports_torch_and_keeps_pip_installs_across_a_restart(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    """Colab's first kernel is the image's PyTorch: it imports torch and trains a few steps on both
    Colab paths; a `%pip install` from the notebook imports at once and again after a stop and start.

    Kept apart from the README walk so that this part (the image's PyTorch behind Colab's default
    kernel) shows its own result.
    """
    token = TOKEN_FILE.read_text().strip()
    with _forja_tunnel() as (url, _):
        for run_cell in (colab.run_via_http_over_ws, colab.run_via_direct):
            said = run_cell(url, token, TRAIN_A_FEW_STEPS, timeout_s=300)
            found = re.search(r"^torch (\S+) first (\S+) last (\S+)$", said, flags=re.M)
            assert found, f"the default kernel has no working torch: {said}"
            assert float(found[3]) < float(found[2]), said
        installed = colab.run_via_direct(url, token, f"%pip install -q {PIP_PACKAGE}\n{PIP_IMPORT}",
                                         timeout_s=300)
        assert "pip forja_run" in installed, installed
    down = _forja(*SPOT, "down")
    assert down.returncode == 0, down.stdout[-2000:] + down.stderr[-2000:]
    with _forja_tunnel(*SPOT, start=True) as (url, _):
        _wait_for_jupyter(url, token)
        for run_cell in (colab.run_via_http_over_ws, colab.run_via_direct):
            said = run_cell(url, token, f"import torch\n{PIP_IMPORT}", timeout_s=120)
            assert "pip forja_run" in said, said


#: The worked example project (examples/own-loop: its own model, train.py on trainer.runlib and a
#: requirements.txt), run as its README says. A pause per step makes it last about a minute of
#: wall time on little CPU, so a maintenance event sent once it has logged OWN_PREEMPT_AT steps lands
#: mid-run; it saves a checkpoint every 20 steps and on the preemption's SIGTERM.
OWN_LOOP = ROOT / "examples" / "own-loop"
OWN_STEPS = 1200
OWN_PREEMPT_AT = 100
OWN_ARGS = ("--steps", str(OWN_STEPS), "--pause-s", "0.05", "--save-every", "20", "--log-every", "10")
#: The trainer_run task that installs a project's requirements.txt into its hash-named environment.
BUILD_PROJECT_ENV = "Build the project's environment on the trainer's"


@dataclasses.dataclass(frozen=True)
class OwnLoopRun:
    """The example project's first run: started, preempted once, followed to its end."""

    project: Path
    name: str
    started: dict[str, Any]  # `forja --json train --script ... --detach`
    preempted_at: int  # the step the host reported just before the maintenance event
    followed: dict[str, Any]  # `forja --json follow NAME` after `forja up`


def _forja_json(*args: str, cwd: Path = ROOT) -> Any:
    proc = _forja("--json", *args, cwd=cwd)
    assert proc.returncode == 0, f"forja {' '.join(args)}: rc {proc.returncode}\n" + (
        proc.stdout[-3000:] + proc.stderr[-3000:])
    return json.loads(proc.stdout)


def _last_step(line: str) -> int:
    """The step of a metrics.jsonl line; 0 before the first line."""
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return int(json.loads(line)["step"])
    return 0


def _run_state(name: str) -> dict[str, Any]:
    """The run as `forja status NAME` reports it from the host (rank 0)."""
    (state,) = [s for s in _forja_json("status", name) if s["run"] == name]
    return state


def _changed(train_json: dict[str, Any]) -> list[str]:
    return [t["task"] for t in train_json["playbook_result"]["changed_tasks"]]


@pytest.fixture(scope="module")
def own_loop_run(first_run: subprocess.CompletedProcess[str], tmp_path_factory: pytest.TempPathFactory,
                 ) -> OwnLoopRun:
    """`forja train --script train.py` from a copy of the example project, as a user runs it from
    their folder; Google takes the Spot VM away once the run has logged OWN_PREEMPT_AT steps;
    `forja up` starts it, the unit resumes at boot, and `forja follow` follows it to its end."""
    project = tmp_path_factory.mktemp("own-loop") / "own-loop"
    shutil.copytree(OWN_LOOP, project, ignore=shutil.ignore_patterns("__pycache__", "forja-run*"))
    name = f"own-loop-{uuid.uuid4().hex[:6]}"  # the history outlives the module
    started = _forja_json("train", "--script", "train.py", "--name", name, "--detach", "--", *OWN_ARGS,
                          cwd=project)
    assert (started["run_id"], started["status"], started["detached"]) == (name, "running", "detach")

    (vm,) = _instances()
    metrics = f"/var/lib/forja/runs/{name}/{run_folder.METRICS}"
    deadline = time.monotonic() + 300
    # The last metrics line, read over SSH: a `forja status` a second (a playbook each) kept a core busy
    while _last_step(_on_host(vm, f"sudo tail -n 1 {metrics} 2>/dev/null")) < OWN_PREEMPT_AT:
        assert time.monotonic() < deadline, f"the run did not reach step {OWN_PREEMPT_AT}: {_run_state(name)}"
        time.sleep(1)
    state = _run_state(name)
    assert state["status"] == "running", f"the run ended before the maintenance event: {state}"
    _preempt(vm)

    up = _forja(*SPOT, "up")
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
    # As a user would: follow at once. While the host boots, the queued unit reads "running", not
    # the "preempted" of the boot before, so the follower does not stop before the run resumes.
    followed = _forja_json("follow", name, cwd=project)
    return OwnLoopRun(project, name, started, state["step"], followed)


def test_the_example_project_resumes_from_its_own_checkpoint_after_a_maintenance_event(
    own_loop_run: OwnLoopRun,
) -> None:
    """The issue's example project, through `forja train --script`: its requirements were installed
    (the first run built their environment), a maintenance event mid-run preempted it, and it resumed
    from its own checkpoint, not from step 0, to the end; the fetched metrics, the journal and the
    history row all say so."""
    run, followed = own_loop_run, own_loop_run.followed
    assert any(BUILD_PROJECT_ENV in task for task in _changed(run.started)), _changed(run.started)
    summary = followed["summary"]
    assert followed["status"] == "completed", followed
    assert (summary["status"], summary["steps"], summary["preemptions"]) == (
        "completed", OWN_STEPS, 1), summary
    resumed = summary["resumed_from_step"]
    assert run.preempted_at <= resumed < OWN_STEPS, (run.preempted_at, summary)

    results = run.project / "forja-runs" / run.name / "forja-l4"
    assert Path(followed["artifact_dir"]).resolve() == results.resolve()
    steps = [json.loads(line)["step"] for line in (results / run_folder.METRICS).read_text().splitlines()]
    assert steps == list(range(10, OWN_STEPS + 1, 10)), "each step logged once: no restart from 0, no repeat"
    events = [json.loads(line) for line in (results / run_folder.EVENTS).read_text().splitlines()]
    assert [e["resumed_from_step"] for e in events if e.get("event") == "resume"] == [resumed], events
    logs = _forja("logs", run.name, "--lines", "2000", cwd=run.project)  # both boots' journal
    assert logs.returncode == 0, logs.stdout[-2000:] + logs.stderr[-2000:]
    assert f"resumed from step {resumed}" in logs.stdout, logs.stdout[-3000:]  # train.py's own line

    (row,) = [r for r in _forja_json("runs") if r["run_id"] == run.name]
    assert (row["status"], row["steps"], row["preemptions"], row["hosts"]) == (
        "completed", OWN_STEPS, 1, ["forja-l4"]), row
    assert row["lost_steps"] == summary["lost_steps"], (row, summary)
    assert row["last_loss"] == pytest.approx(summary["final_loss"]), (row, summary)


def test_a_second_run_of_the_example_project_installs_nothing(own_loop_run: OwnLoopRun) -> None:
    """The same requirements.txt again: its environment (named by the file's hash) is reused, so
    the play changes none of the requirements tasks; the run itself still trains to the end."""
    name = f"{own_loop_run.name}-again"
    again = _forja_json("train", "--script", "train.py", "--name", name, "--", "--steps", "30",
                        cwd=own_loop_run.project)
    assert again["status"] == "completed" and again["summary"]["steps"] == 30, again
    changed = _changed(again)
    assert changed, "the run itself changes the host (its env file, its unit): the count is read"
    assert not [t for t in changed if "requirements" in t.lower() or BUILD_PROJECT_ENV in t], changed


def _final_model(folder: Path) -> dict[str, Any]:
    """The model tensors of the newest checkpoint fetched into `folder`."""
    from trainer.checkpoint import load_checkpoint

    newest = max(folder.rglob("ckpt-*.pt"), key=lambda p: int(re.findall(r"\d+", p.name)[0]))
    return load_checkpoint(newest)["model"]


@pytest.mark.timeout(2700)  # the drill, then a reference run; on two busy cores it passed 900 s
def test_a_managed_spot_run_survives_a_preemption_and_a_stock_out_and_ends_bit_exact(
    first_run: subprocess.CompletedProcess[str], tmp_path: Path,
) -> None:
    """`forja train --managed` with nobody at the keyboard (forja_sandbox/drill.py): preempted once,
    the VM is started again in its zone; preempted again while that zone is out of capacity, the VM
    is made again in the fallback zone Google's capacity advice scores best (never attempted in the
    low-scored one the user named first) and the run resumes there from the bucket; the history
    says why. The Colab tunnel keeps its port and token throughout. The result equals an
    uninterrupted run's, bit for bit."""
    from forja_sandbox import drill

    config = yaml.safe_load((ROOT / "trainer" / "configs" / "digits.yaml").read_text())
    # long enough to be preempted twice while it trains: the second preemption came at step 238 on
    # a quiet machine and 218 under load (the drill preempts as soon as the restarted run steps on);
    # short enough that the rest of the run and the unbroken reference run are brief (at 6,000 steps
    # they took 140 s and 277 s of the test's 546 s, under load)
    config.update(steps=2000, checkpoint_every_s=2, log_every_steps=100)
    path = tmp_path / "managed.yaml"
    path.write_text(yaml.safe_dump(config))
    forja = Forja(tmp_path, INVENTORY, extravars={"gcp_instance_spot": True}, host_key_checking=False,
                  history=History(tmp_path / "history.sqlite"), send_project=False)
    forja.up()  # as a user starts the day: the VM may have been stopped by an earlier step
    (name, vm), = forja.observe().items()
    fallback = [z for z in ("us-east1-b", "us-central1-a", "us-east1-d") if z != vm.zone]
    # the VM made again in the fallback zone boots over the roles' environments: its converge from
    # scratch is first_run's; what is tested here is the recovery
    with testsandbox.vms_over_the_site_env():
        report = drill.run_drill(forja, path, run="managed", host=name, fallback_zones=fallback,
                                 token_file=TOKEN_FILE, bucket="forja-sandbox-checkpoints",
                                 bucket_prefix="checkpoints", advised=(fallback[0], fallback[1]))
    print("\n".join(report.said + report.tunnel_said))
    for r in report.recoveries:  # the measures bench/managed_bench.py tabulates
        print(f"recovery {r.kind}: {r.zone_before} -> {r.zone_after}, "
              f"resumed after {r.seconds_to_resumed:.0f} s")
    assert report.outcome == "the run completed", report
    first, second = report.recoveries
    assert (first.kind, first.zone_after) == ("restart", first.zone_before)
    # straight to the zone the advice scores best, though the user named the low-scored one first
    assert second.kind == "move" and second.zone_after == fallback[1] != second.zone_before
    kinds = [kind for kind, _ in report.events]
    assert kinds.count("preempted") == 2 and {"restarted", "stockout", "zone_moved"} <= set(kinds), kinds
    moved = next(data for kind, data in report.events if kind == "zone_moved")
    assert (moved["from_zone"], moved["to_zone"]) == (second.zone_before, second.zone_after)
    assert moved["seconds_down"] > 0
    assert moved["zone_signal"] == "advice" and moved["zone_order"][0] == fallback[1], moved
    scores = {score["zone"]: score["obtainability"] for score in moved["zone_scores"]}
    assert scores[fallback[1]] > scores[fallback[0]], moved
    print(f"advised move: resumed in {second.zone_after} {second.seconds_to_resumed:.0f} s after the "
          "preemption (goal: 180 s)")
    # Colab: the same local URL and the same token before and after both recoveries
    assert report.cells == ["42", "42", "42"]
    summary = report.summary
    assert summary["steps"] == config["steps"] and summary["preemptions"] == 2, summary
    per_interval = summary["samples_per_s"] / config["batch_size"] * config["checkpoint_every_s"]
    assert summary["lost_steps"] <= 2 * (per_interval + config["log_every_steps"]), summary
    (record,) = [r for r in forja.runs() if r.run_id == "managed"]
    assert (record.status, record.preemptions) == ("completed", 2)
    # one run from its first send to where it completed, after both recoveries, settled there: its
    # cost covers every boot less the time down, not the part up to a preemption (cost-definition.md)
    times = {e.kind: datetime.fromisoformat(e.time) for e in reversed(forja.history.events("managed"))}
    assert datetime.fromisoformat(record.started_at) <= times["preempted"]  # the first preemption's
    assert record.ended_at is not None and datetime.fromisoformat(record.ended_at) >= times["zone_moved"]
    assert cost_report.settled_cost(forja.history, "managed") == record.cost_usd > 0

    # the unbroken run checkpoints only at its end: how often a run checkpoints must not change its
    # result either, and the 2 s checkpoints (each sent to the bucket) were most of its time
    unbroken_config = tmp_path / "unbroken.yaml"
    unbroken_config.write_text(yaml.safe_dump({**config, "checkpoint_every_s": 3600}))
    reference = forja.train(unbroken_config, name="managed-ref", checkpoints=True)
    assert reference.status == "completed"
    forja.fetch("managed", tmp_path / "managed", checkpoints=True)
    interrupted, unbroken = _final_model(tmp_path / "managed"), _final_model(reference.artifact_dir)
    assert interrupted.keys() == unbroken.keys()
    for key in interrupted:
        assert torch.equal(interrupted[key], unbroken[key]), key  # bit-identical across a zone move


def test_teardown_leaves_nothing_behind(first_run: subprocess.CompletedProcess[str]) -> None:
    _playbook("playbooks/teardown.yml", "-e", "forja_teardown_delete=true")
    assert _instances() == []
    first, last = testsandbox.HOSTS  # the test sandbox's host slots
    bound = [i for i in testhosts.running() if first <= i <= last]
    assert bound == [], f"hosts of deleted instances still there: {bound}"
    service.destroy()
    assert service.describe()["running"] is False
    netns = {line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                        text=True).stdout.splitlines() if line.strip()}
    mounts = Path("/proc/mounts").read_text()
    for index in range(first, last + 1):
        assert f"th{index}" not in netns
        assert f"{testhosts.base_dir() / 'hosts' / f'th{index}'}/" not in mounts
