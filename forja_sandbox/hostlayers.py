"""Cached test-host layers where part of a role has run, by name (over `testhosts.ensure_layer`).

Why: building the trainer's environment (pip installing the trainer's packages beside the Deep
Learning VM image's PyTorch) took 80-100 s of a busy CI machine on each host that trains. It is built
from scratch where that is what is tested (molecule/trainer_run, the sandbox's site e2e); the other
hosts that train (the API tests' th6, the trainer_script scenario's th21) boot over this layer. It is
built by the role's own tasks (layers/trainer_env.yml) and named by a hash of everything it is built
from: the role and the one it depends on, the collection's modules, the trainer's pins, the pip
arguments and the image layers under it. A change to any of them builds a new layer at the next
use, so no host boots a stale one; and a host over a layer the role no longer agrees with would
only be rebuilt by the role (its environment record), never wrong.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from forja_sandbox import testhosts

ROOT = Path(__file__).resolve().parents[1]
LAYERS = Path(__file__).with_name("layers")
#: The host that builds the layers: reserved for it (no test boots th38).
BUILDER = 38
#: Inside the test hosts, the controller's wheelhouse (testhosts.wheelhouse_dir, mounted read-only).
HOST_WHEELHOUSE = "/var/cache/forja-pip/wheelhouse"
#: trainer_run_pip_extra_args of every test host that trains: the wheelhouse first. The layer's
#: environment is built with it, and a host whose role is given other arguments builds its own.
PIP_ARGS = f"--find-links {HOST_WHEELHOUSE}"
#: What the trainer-env layer is built from, in the repository: its playbook, the role and the one it
#: depends on, the collection's modules and the trainer's pins.
TRAINER_ENV_INPUTS = ("forja_sandbox/layers/trainer_env.yml", "roles/trainer_run", "roles/host_contract",
                      "plugins/modules", "plugins/module_utils", "trainer/requirements.txt")


def trainer_requirements() -> list[str]:
    """What the trainer_run role installs, read from its defaults and the trainer's requirements.txt
    (the lists the role reads, not copies): the wheelhouse the test hosts install from."""
    defaults = yaml.safe_load((ROOT / "roles/trainer_run/defaults/main.yml").read_text())
    pins = (ROOT / "trainer/requirements.txt").read_text().splitlines()
    return [defaults["trainer_run_torch_package"], f"pip=={defaults['trainer_run_pip_version']}",
            *(line.strip() for line in pins if line.strip() and not line.lstrip().startswith("#"))]


def ensure_trainer_wheelhouse() -> Path:
    """Download the trainer's wheels once on the controller (Python 3.10, manylinux), into the folder
    the hosts mount: PyPI's responses are not cacheable through this machine's egress."""
    return testhosts.ensure_wheelhouse(tuple(trainer_requirements()))


def _converge(host: testhosts.Host, playbook: Path, variables: dict[str, object]) -> None:
    """Run ``playbook`` on ``host`` with the repository's ansible.cfg; TestHostError with its tail."""
    with tempfile.TemporaryDirectory(prefix="forja-layer-") as tmp:
        inventory = Path(tmp) / "inventory.yml"
        inventory.write_text(yaml.safe_dump({"all": {"vars": variables, "hosts": {host.name: {
            "ansible_host": host.address, "ansible_user": host.user,
            "ansible_ssh_private_key_file": str(host.key),
            "ansible_ssh_common_args": " ".join(testhosts.SSH_OPTIONS)}}}}))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "FORJA_"))}
        proc = subprocess.run(
            [str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), str(playbook)],
            cwd=ROOT, env={**env, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
            capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise testhosts.TestHostError(f"building the layer with {playbook.name} on {host.name} failed:\n"
                                      f"{proc.stdout[-4000:]}{proc.stderr[-2000:]}")


def trainer_env_key(root: Path, dlvm: Path) -> str:
    """The trainer-env layer's key: its inputs under the checkout ``root``, the pip arguments, and the
    Deep Learning VM layer ``dlvm`` it is built over (a rebuilt one has another mtime)."""
    return testhosts.layer_key([root / p for p in TRAINER_ENV_INPUTS], PIP_ARGS, *testhosts.DLVM_REQUIREMENTS,
                               f"{dlvm}@{dlvm.stat().st_mtime_ns}")


def trainer_env() -> Path:
    """The layer over the Deep Learning VM image where the trainer's environment is built (cached)."""
    ensure_trainer_wheelhouse()
    dlvm = testhosts.ensure_dlvm()
    playbook = LAYERS / "trainer_env.yml"
    # validate.yml judges a run's inputs before it reads the host: the demo's, for a run never sent
    variables = {"trainer_run_pip_extra_args": PIP_ARGS, "trainer_run_name": "layer",
                 "trainer_run_config": str(ROOT / "trainer/configs/digits.yaml")}
    return testhosts.ensure_layer("trainer-env", trainer_env_key(ROOT, dlvm),
                                  lambda host: _converge(host, playbook, variables),
                                  builder=BUILDER, image="dlvm")


#: The layers by the name a molecule platform gives (`layer:`), each over its image.
LAYER_BUILDERS = {"trainer-env": trainer_env}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m forja_sandbox.hostlayers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layer", choices=sorted(LAYER_BUILDERS),
                        help="print the layer's folder, built if missing")
    args = parser.parse_args(argv)
    try:
        print(LAYER_BUILDERS[args.layer]())
    except testhosts.TestHostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
