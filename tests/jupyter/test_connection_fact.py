"""The role tells the user (and the controller, as the fact jupyter_colab_connection) how to connect.

The role's connection step is run on its own against localhost hosts (it only sets a fact and
prints): one host looks like a GCP instance, the others like plain SSH hosts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import yaml
from jupyter_helpers import REPO, ansible_playbook

#: The runs' live metrics ports (the host contract's), which every tunnel command forwards after Jupyter's.
_CONTRACT = yaml.safe_load((REPO / "roles/host_contract/defaults/main.yml").read_text())
_FIRST = _CONTRACT["host_contract_metrics_port"]
METRICS_PORTS = list(range(_FIRST, _FIRST + _CONTRACT["host_contract_metrics_ports"]))
METRICS = "".join(f" -L {port}:127.0.0.1:{port}" for port in METRICS_PORTS)

HOSTS = {
    "gcp": {"gcp_name": "forja-l4", "zone": "us-east1-d", "ansible_host": "34.1.2.3",
            "jupyter_colab_tunnel_style": "gcloud"},
    "gcp_no_iap": {"gcp_name": "forja-l4", "zone": "us-east1-d", "jupyter_colab_tunnel_via_iap": False,
                   "jupyter_colab_tunnel_style": "gcloud"},
    "inventoried": {"instance_name": "forja-l4", "zone": "us-east1-d", "project": "my-proj",
                    "jupyter_colab_tunnel_style": "gcloud"},
    "sandboxed": {"instance_name": "forja-l4", "zone": "us-east1-d", "ansible_host": "10.213.0.21",
                  "ansible_user": "ansible"},
    "through_iap": {"instance_name": "forja-l4", "zone": "us-east1-d", "ansible_host": "10.128.0.5",
                    "ansible_user": "ansible", "ansible_ssh_private_key_file": "/keys/id",
                    "ansible_ssh_common_args": "-o StrictHostKeyChecking=accept-new -o 'ProxyCommand="
                    "gcloud compute start-iap-tunnel forja-l4 %p --listen-on-stdin --zone=us-east1-d'"},
    "forced_ssh": {"gcp_name": "forja-l4", "zone": "us-east1-d", "ansible_host": "34.1.2.3",
                   "jupyter_colab_tunnel_style": "ssh"},
    "plain": {"ansible_host": "10.213.0.11", "ansible_user": "ansible"},
    "odd_port": {"ansible_host": "10.0.0.7", "ansible_user": "me", "ansible_port": 2222,
                 "ansible_ssh_private_key_file": "/keys/id", "jupyter_colab_port": 9999},
}


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> str:
    work = tmp_path_factory.mktemp("connection")
    inventory = {"all": {"hosts": HOSTS, "vars": {"ansible_connection": "local"}}}
    (work / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (work / "play.yml").write_text(yaml.safe_dump([{
        "name": "Describe the connection", "hosts": "all", "gather_facts": False,
        "tasks": [
            {"name": "Run the role's connection step", "ansible.builtin.include_role": {
                "name": "forja.gpu.jupyter_colab", "tasks_from": "connection.yml"},
             "vars": {"jupyter_colab_fetch_token": False}},
            {"name": "Show the fact", "ansible.builtin.debug": {"var": "jupyter_colab_connection"}},
        ],
    }]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_CALLBACK_FORMAT_PRETTY": "false"}
    run = subprocess.run(
        [ansible_playbook(), "-i", str(work / "inventory.yml"), str(work / "play.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _fact(output: str, host: str) -> dict:
    match = re.search(rf'^ok: \[{host}\] => (\{{"jupyter_colab_connection".*)$', output, re.MULTILINE)
    assert match, output
    return json.loads(match.group(1))["jupyter_colab_connection"]


def test_a_gcp_instance_gets_the_gcloud_iap_command_with_equal_ports(output: str):
    assert _fact(output, "gcp")["tunnel_command"] == (
        "gcloud compute ssh forja-l4 --zone us-east1-d --tunnel-through-iap -- -N -L 8888:127.0.0.1:8888"
        + METRICS
    )


def test_iap_can_be_left_out(output: str):
    assert _fact(output, "gcp_no_iap")["tunnel_command"] == (
        "gcloud compute ssh forja-l4 --zone us-east1-d -- -N -L 8888:127.0.0.1:8888" + METRICS
    )


def test_the_gcp_inventory_hostvars_give_the_gcloud_command_with_the_project(output: str):
    assert _fact(output, "inventoried")["tunnel_command"] == (
        "gcloud compute ssh forja-l4 --zone us-east1-d --project my-proj --tunnel-through-iap"
        " -- -N -L 8888:127.0.0.1:8888" + METRICS
    )


def test_the_ssh_command_takes_ansibles_path_through_iap(output: str):
    assert _fact(output, "through_iap")["tunnel_command"] == (
        "ssh -N -L 8888:127.0.0.1:8888" + METRICS + " -i /keys/id -o StrictHostKeyChecking=accept-new -o "
        "'ProxyCommand=gcloud compute start-iap-tunnel forja-l4 %p --listen-on-stdin --zone=us-east1-d'"
        " ansible@10.128.0.5"
    )


def test_a_gcp_instance_gets_ansibles_ssh_path_unless_gcloud_is_asked(output: str):
    fact = _fact(output, "sandboxed")
    assert fact["tunnel_command"] == f"ssh -N -L 8888:127.0.0.1:8888{METRICS} ansible@10.213.0.21"


def test_the_ssh_form_can_be_forced(output: str):
    assert _fact(output, "forced_ssh")["tunnel_command"] == f"ssh -N -L 8888:127.0.0.1:8888{METRICS} 34.1.2.3"


def test_a_plain_host_gets_an_ssh_command(output: str):
    fact = _fact(output, "plain")
    assert fact["tunnel_command"] == f"ssh -N -L 8888:127.0.0.1:8888{METRICS} ansible@10.213.0.11"


def test_port_and_key_of_the_inventory_are_used(output: str):
    fact = _fact(output, "odd_port")
    assert fact["tunnel_command"] == f"ssh -N -L 9999:127.0.0.1:9999{METRICS} -p 2222 -i /keys/id me@10.0.0.7"
    assert fact["port"] == 9999
    assert fact["metrics_ports"] == METRICS_PORTS
    assert fact["colab_url_template"] == "http://localhost:9999/?token=<token>"


def test_the_fact_names_where_the_token_is_without_containing_it(output: str):
    fact = _fact(output, "plain")
    assert fact["token_file"] == "/var/lib/forja/jupyter/token"
    assert fact["local_token_file"] == ""
    assert fact["colab_url_template"].endswith("?token=<token>")
