"""Run Ansible's own ``ansible-test sanity`` on the forja.gpu collection, offline.

The repository root is the collection root, but ansible-test needs a real (not symlinked) path
ending in ``ansible_collections/forja/gpu``, and it should test what users install, not the
clone's tests, sandbox and venv. So this builds the collection with ``ansible-galaxy collection
build`` (galaxy.yml's ``build_ignore`` says what stays out, the ``collections/`` link back to the
clone among it), unpacks the tarball into a temporary ``ansible_collections/forja/gpu``, adds
``tests/sanity/ignore-2.19.txt`` (the accepted exceptions, each with its reason) and runs every
sanity test there with this venv's Python.

ansible-test bootstraps pip into each test's virtual environment with a ``get-pip`` script it
downloads from ci-files.testing.ansible.com; with no network that fails, so a stand-in that uses
``ensurepip`` is put in its cache first (never over a real one). The tests' own requirements
(pylint, pycodestyle, voluptuous...) come from pip's configured index or wheel folder and stay
cached in ``~/.ansible/test/venv`` after the first run.

Usage: ``python tests/sanity/run.py [ansible-test sanity arguments]``, for example
``python tests/sanity/run.py --test validate-modules``. The exit status is ansible-test's.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NAMESPACE, NAME = "forja", "gpu"
IGNORE_FILES = sorted((REPO / "tests" / "sanity").glob("ignore-*.txt"))

# A stand-in for pip's get-pip.py: ansible-test runs it as `get_pip.py [pip options] pip==X
# --no-setuptools --no-wheel` in a fresh venv. The bundled pip first, then the pinned one from
# pip's configured index (or wheel folder); if that cannot be reached the bundled pip stays.
GET_PIP_STAND_IN = '''\
"""Stand-in for get-pip.py, written by forja's tests/sanity/run.py (no network here)."""
import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
if subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", *args]) != 0:
    print("get-pip stand-in: kept the bundled pip", file=sys.stderr)
'''


def pip_bootstrap_path() -> Path:
    """The cache path where ansible-test looks for its pip bootstrap script.

    The pip version is ansible-test's own pin (``get_venv_packages`` in python_requirements.py),
    read from its source so that an ansible-core upgrade moves this path with it.
    """
    spec = importlib.util.find_spec("ansible_test")
    if spec is None or spec.origin is None:
        raise SystemExit("ansible-test is not installed in this Python; run `make venv` first")
    source = Path(spec.origin).parent / "_internal" / "python_requirements.py"
    found = re.search(r"pip='([0-9.]+)'", source.read_text(encoding="utf-8"))
    if found is None:
        raise SystemExit(f"cannot find ansible-test's pip version in {source}")
    version = found.group(1).replace(".", "_")
    return Path.home() / ".ansible" / "test" / "cache" / f"get_pip_{version}.py"


def ensure_pip_bootstrap() -> None:
    """Put the offline stand-in where ansible-test would cache the downloaded script."""
    path = pip_bootstrap_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(GET_PIP_STAND_IN, encoding="utf-8")


def tool_env() -> dict[str, str]:
    """The environment with this Python's scripts (ansible-galaxy, ansible-test) first on PATH."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def build_collection(workdir: Path) -> Path:
    """Build the tarball users install and unpack it where ansible-test wants it."""
    out = workdir / "build"
    subprocess.run(
        ["ansible-galaxy", "collection", "build", "--force", "--output-path", str(out), str(REPO)],
        check=True,
        stdout=subprocess.DEVNULL,
        env=tool_env(),
    )
    (tarball,) = out.glob(f"{NAMESPACE}-{NAME}-*.tar.gz")
    root = workdir / "ansible_collections" / NAMESPACE / NAME
    root.mkdir(parents=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(root, filter="data")
    sanity = root / "tests" / "sanity"
    sanity.mkdir(parents=True, exist_ok=True)
    for ignore in IGNORE_FILES:
        shutil.copy2(ignore, sanity / ignore.name)
    return root


def main(argv: list[str]) -> int:
    ensure_pip_bootstrap()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    with tempfile.TemporaryDirectory(prefix="forja-sanity-") as tmp:
        root = build_collection(Path(tmp))
        command = ["ansible-test", "sanity", "--python", python, "--color", "no", *argv]
        return subprocess.run(command, cwd=root, env=tool_env(), check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
