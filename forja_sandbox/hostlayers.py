"""Cached test-host layers where part of the roles has run, by name (over `testhosts.ensure_layer`).

Why: building the trainer's environment (pip installing the trainer's packages beside the Deep
Learning VM image's PyTorch) took 80-100 s of a busy CI machine on each host that trains, and the
notebook server's venv 30-50 s more on each host that serves Jupyter. Both are built from scratch
where that is what is tested (molecule/trainer_run and molecule/jupyter_colab, the sandbox's first
VM in the site e2e); the other hosts boot over a layer where the roles' own tasks built them:

- ``trainer-env`` (layers/trainer_env.yml, the wheelhouse's pip arguments): the hosts that train
  with those arguments, the API tests' th6 and the trainer_script scenario's th21;
- ``site-env`` (layers/site_env.yml, the roles' defaults, as on the sandbox's VMs and an own
  machine): the trainer's environment and the notebook server's venv, for the re-run tests' th25,
  the own machine's th44 and the sandbox VMs a test asks for (`service.boot_over`).

A layer is named by a hash of everything it is built from: its playbook, the roles and the one they
depend on, the collection's modules, the trainer's pins, the pip arguments and the image layers
under it. A change to any of them builds a new layer at the next use, so no host boots a stale one;
and a host over a layer the roles no longer agree with would only be rebuilt by the roles (their
environment records), never wrong.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from forja_sandbox import testhosts

ROOT = Path(__file__).resolve().parents[1]
LAYERS = Path(__file__).with_name("layers")
#: Inside the test hosts, the controller's wheelhouse (testhosts.wheelhouse_dir, mounted read-only).
HOST_WHEELHOUSE = "/var/cache/forja-pip/wheelhouse"
#: trainer_run_pip_extra_args of the hosts over the trainer-env layer: the wheelhouse first. The
#: layer's environment is built with it, and a host whose role is given other arguments builds its own.
PIP_ARGS = f"--find-links {HOST_WHEELHOUSE}"
#: What both layers are built from, in the repository: trainer_run and the role it depends on, the
#: collection's modules and the trainer's pins.
_TRAINER_INPUTS = ("roles/trainer_run", "roles/host_contract", "plugins/modules", "plugins/module_utils",
                   "trainer/requirements.txt")


@dataclass(frozen=True)
class EnvLayer:
    """A layer of environments built over the Deep Learning VM layer by the roles' own tasks."""

    name: str
    #: the playbook under layers/ that builds it
    playbook: str
    #: trainer_run_pip_extra_args it is built with (part of the trainer environment's record)
    pip_args: str
    #: what else it is built from, in the repository, besides its playbook
    inputs: tuple[str, ...]
    #: the test host that builds it, reserved for it (no test boots it): one per layer, so that two
    #: lanes may build two layers at once
    builder: int

    def key(self, root: Path, dlvm: Path) -> str:
        """The layer's key: its inputs under the checkout ``root``, the pip arguments, and the Deep
        Learning VM layer ``dlvm`` it is built over (a rebuilt one has another mtime)."""
        files = [root / p for p in (f"forja_sandbox/layers/{self.playbook}", *self.inputs)]
        return testhosts.layer_key(files, self.pip_args, *testhosts.DLVM_REQUIREMENTS,
                                   f"{dlvm}@{dlvm.stat().st_mtime_ns}")


TRAINER_ENV = EnvLayer("trainer-env", "trainer_env.yml", PIP_ARGS, _TRAINER_INPUTS, builder=38)
SITE_ENV = EnvLayer("site-env", "site_env.yml", "", ("forja_sandbox/layers/trainer_env.yml", *_TRAINER_INPUTS,
                                                      "roles/jupyter_colab"), builder=37)


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


def ensure(layer: EnvLayer) -> Path:
    """The layer's folder over the Deep Learning VM image, built when missing (cached)."""
    if layer.pip_args:
        ensure_trainer_wheelhouse()
    dlvm = testhosts.ensure_dlvm()
    # validate.yml judges a run's inputs before it reads the host: the demo's, for a run never sent
    variables = {"trainer_run_pip_extra_args": layer.pip_args, "trainer_run_name": "layer",
                 "trainer_run_config": str(ROOT / "trainer/configs/digits.yaml")}
    return testhosts.ensure_layer(layer.name, layer.key(ROOT, dlvm),
                                  lambda host: _converge(host, LAYERS / layer.playbook, variables),
                                  builder=layer.builder, image="dlvm")


def trainer_env() -> Path:
    """The trainer-env layer: the trainer's environment, built with the wheelhouse (PIP_ARGS)."""
    return ensure(TRAINER_ENV)


def site_env() -> Path:
    """The site-env layer: the trainer's environment and the notebook server's venv, built with the
    roles' defaults."""
    return ensure(SITE_ENV)


#: The layers by the name a molecule platform gives (`layer:`), each over its image.
LAYER_BUILDERS = {layer.name: functools.partial(ensure, layer) for layer in (TRAINER_ENV, SITE_ENV)}


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
