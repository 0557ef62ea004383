"""One machine catalog serves the gcp module, the cost code and the emulator.

Its home is plugins/module_utils/forja_gcp_machines.py (the module can only use module_utils);
forja.cost and the sandbox's Compute emulator load that same file through forja.machines, and the
price table holds prices keyed by each type's price key, nothing about the machines.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.forja.gpu.plugins.module_utils import forja_gcp_machines as module_catalog

from forja import machines
from forja.cost.prices import DEFAULT_TABLE, PriceError, load_prices
from forja.cost.spend import Instance, machine_rate
from forja_sandbox.compute_emulator import catalog as emulator_catalog

REPO = Path(__file__).resolve().parents[2]


def _fields(machine: object) -> dict:
    return dataclasses.asdict(machine)  # type: ignore[arg-type]


def test_forja_loads_the_file_the_module_ships():
    assert machines.catalog_path() == REPO / "plugins/module_utils/forja_gcp_machines.py"
    loaded = {name: _fields(m) for name, m in machines.machine_types().items()}
    shipped = {name: _fields(m) for name, m in module_catalog.MACHINE_TYPES.items()}
    assert loaded == shipped and "g2-standard-8" in loaded


def test_the_catalog_imports_nothing_but_the_standard_library():
    """AnsiballZ ships it to hosts and forja loads it by path: no Ansible, no forja inside."""
    source = (REPO / "plugins/module_utils/forja_gcp_machines.py").read_text()
    imports = re.findall(r"^(?:from|import) (\S+)", source, flags=re.M)
    assert imports and set(imports) <= {"__future__", "re", "dataclasses"}, imports


def test_the_module_checks_gpus_against_the_same_table():
    attached = {
        name: (m.gpu_type, m.gpu_count) for name, m in module_catalog.MACHINE_TYPES.items() if m.gpu_type
    }
    assert attached == module_catalog.ATTACHED_GPUS
    for name, (gpu, count) in attached.items():
        assert module_catalog.resolve_gpus(name, None, None).gpu_count == count
        assert module_catalog.resolve_gpus(name, gpu, count).gpu_type == gpu


def test_every_priced_machine_type_is_a_price_key_of_the_catalog():
    priced = set((yaml.safe_load(DEFAULT_TABLE.read_text()) or {})["machine_types"])
    keys = {m.key for m in machines.machine_types().values()}
    assert priced and priced <= keys, sorted(priced - keys)


def test_the_price_table_holds_no_machine_facts():
    table = yaml.safe_load(DEFAULT_TABLE.read_text())
    for name, regions in table["machine_types"].items():
        assert set(regions) <= {"us-east1", "us-central1", "europe-west4", "asia-east1"}, name


def test_a_price_file_that_describes_gpus_is_refused_naming_the_entry(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text(
        yaml.safe_dump({"machine_types": {"g2-standard-8": {"gpu": {"type": "nvidia-l4", "count": 1}}}})
    )
    with pytest.raises(PriceError) as err:
        load_prices(own, env={})
    assert "'machine_types.g2-standard-8.gpu'" in str(err.value)
    assert "forja_gcp_machines.py" in str(err.value)


@pytest.mark.parametrize(
    ("record", "usd"),
    [
        # The catalog says g2-standard-8 comes with its L4: one figure, even when the record lists the GPU.
        (
            {"machine_type": "g2-standard-8", "zone": "us-east1-d", "gpu_type": "nvidia-l4", "gpu_count": 1},
            0.8536,
        ),
        ({"machine_type": "g2-standard-8", "zone": "us-east1-d"}, 0.8536),
        # N1 carries none: its attached T4s are added per GPU.
        (
            {
                "machine_type": "n1-standard-8",
                "zone": "us-east1-c",
                "gpu_type": "nvidia-tesla-t4",
                "gpu_count": 2,
            },
            0.38 + 2 * 0.35,
        ),
    ],
)
def test_the_rate_takes_the_gpus_a_type_carries_from_the_catalog(record, usd):
    rate = machine_rate(Instance.from_mapping({"name": "vm", **record}), load_prices(env={}))
    assert rate.usd_per_hour == pytest.approx(usd)


def test_the_emulator_serves_the_catalog():
    served = emulator_catalog.MACHINE_TYPES
    catalog = machines.machine_types()
    assert {"g2-standard-8", "a2-highgpu-4g", "a3-highgpu-8g", "n1-standard-4", "e2-standard-4"} <= set(
        served
    )
    for name, machine in served.items():
        known = catalog[name]
        gpu = (known.gpu_type, known.gpu_count) if known.gpu_type else None
        assert (machine.cpus, machine.memory_mb, machine.gpu, machine.shared_cpu) == (
            known.vcpus,
            known.memory_mb,
            gpu,
            known.shared_cpu,
        ), name
    offered = {
        name
        for name, m in catalog.items()
        if m.gpu_type is None or m.gpu_type in emulator_catalog.ACCELERATOR_TYPES
    }
    assert set(served) == offered


def test_forja_imports_no_plugin_code():
    """forja loads module_utils files through forja.module_utils only; it never imports plugins."""
    offenders = []
    for path in sorted((REPO / "forja").rglob("*.py")):
        text = path.read_text()
        if re.search(
            r"^\s*(from|import) (ansible\.module_utils\.forja|ansible_collections\.forja|plugins)\b",
            text,
            flags=re.M,
        ):
            offenders.append(path.relative_to(REPO).as_posix())
        if "spec_from_file_location" in text and path.name != "module_utils.py":
            offenders.append(path.relative_to(REPO).as_posix())
    assert offenders == []
