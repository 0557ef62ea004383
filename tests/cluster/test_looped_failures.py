"""The role loops over a cluster's VMs, so a failure is a loop's; forja must still read the member's.

forja's managed runs act on the error code of the gcp_instance task (a stock-out moves zones), and
its commands print the module's message. Run through forja's own ansible-runner facade, against the
emulator with an injected stock-out, for the plain one-VM case that every user has.
"""

from __future__ import annotations

import pytest
import yaml
from cluster_plays import role_play
from gcp_helpers import emulator_env

from forja import errors, runner

ZONE = "us-east1-d"


def test_a_stockout_of_the_one_vm_reaches_forja_with_its_code_and_message(
    emulator, key_file, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in emulator_env(emulator, key_file).items():
        monkeypatch.setenv(key, value)
    emulator.faults.add(method="instances.insert", error="ZONE_RESOURCE_POOL_EXHAUSTED", zone=ZONE)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {"ansible_connection": "local"}}}}))
    result = runner.run(
        runner.PlaybookRun(
            playbook=str(role_play(tmp_path)),
            inventory=str(inventory),
            host_key_checking=False,
            private_data_dir=tmp_path / "pdd",
        )
    )
    assert not result.ok
    (failed,) = result.failed_tasks
    assert failed.error_code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert failed.message.startswith("no capacity for g2-standard-8"), failed.message
    with pytest.raises(errors.PlaybookFailed):
        result.raise_for_status()
    assert emulator.instances("forja-sandbox") == []
