"""The test run's own sandbox cloud: its own folder, port and host slots, never the machine's own.

`make sandbox` keeps its state in ~/.cache/forja/sandbox, serves on 127.0.0.1:8089 and boots its VMs
as th10 … th19. A test run that used the same sandbox once left a 2-VM cluster in the user's
sandbox when it was interrupted, and the user's next `site.yml` failed on it. So every test run
uses its own: the folder `$TH_BASE/test-sandbox`, the port 8189 (its other services on 8190 …
8193, as 8090 … 8093 beside 8089) and the hosts th50 … th59. `tests/conftest.py` sets these for the
whole run (FORJA_SANDBOX_DIR, FORJA_SANDBOX_PORT, FORJA_SANDBOX_HOSTS), so `forja_sandbox.service`,
the IAP stand-in and every subprocess find them. The inventory is inventory/sandbox with its
endpoints moved to that port: a copy made once per run (`write_inventory()`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from forja_sandbox import hostlayers, ports, service, testhosts

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "inventory" / "sandbox"
PORT = 8189
#: Host slots of the test run's sandbox: beyond every test's fixed host (th1 … th48) and the
#: machine's own sandbox (th10 … th19).
HOSTS = (50, 59)
#: The endpoints of the machine's sandbox (8089 … 8093) in inventory/sandbox's text; the test run's
#: are the same services at PORT's offsets.
PORTS = re.compile(r"(127\.0\.0\.1|10\.213\.0\.1):(80(?:89|9[0-3]))\b")
#: inventory/sandbox pointed at the test run's sandbox (`write_inventory`). Two folders below the
#: checkout, as inventory/sandbox is: its group variables find the checkout's trainer config and
#: results folder from `inventory_dir`.
INVENTORY = REPO / ".test-sandbox" / "sandbox"


def env() -> dict[str, str]:
    """The variables that point the sandbox's service and tools at the test run's own sandbox."""
    return {"FORJA_SANDBOX_DIR": str(testhosts.base_dir() / "test-sandbox"),
            "FORJA_SANDBOX_PORT": str(PORT), "FORJA_SANDBOX_HOSTS": f"{HOSTS[0]}-{HOSTS[1]}"}


def tokens() -> Path:
    """Where the test sandbox's VMs' Jupyter tokens are fetched to (not ~/.config/forja/tokens)."""
    return Path(env()["FORJA_SANDBOX_DIR"]) / "tokens"


def write_inventory(folder: Path = INVENTORY, source: Path = SOURCE) -> Path:
    """Write INVENTORY: the shared group variables (gcp.yml, access.yml) as links to the checkout's
    files; sandbox.yml and the gcp_gpu source as copies with the endpoints moved. Written once per
    run, with the test hosts' lock held (so never by two processes at once), so a change to
    inventory/sandbox is never missed. `source` is another copy of inventory/sandbox to move (an
    installed forja's: tests/sandbox/test_installed_walk.py); `folder`'s parent is replaced."""
    sandbox_dir = env()["FORJA_SANDBOX_DIR"]

    def moved(text: str) -> str:
        text = PORTS.sub(lambda m: f"{m.group(1)}:{PORT + int(m.group(2)) - ports.DEFAULT_PORT}", text)
        return text.replace("~/.cache/forja/sandbox", sandbox_dir)

    shutil.rmtree(folder.parent, ignore_errors=True)
    (folder / "group_vars" / "all").mkdir(parents=True)
    for item in (source / "group_vars" / "all").iterdir():
        target = folder / "group_vars" / "all" / item.name
        if item.is_symlink():
            target.symlink_to(item.resolve())
        else:
            target.write_text(moved(item.read_text()))
    (folder / "gcp_gpu.yml").write_text(moved((source / "gcp_gpu.yml").read_text()))
    # Its VMs' Jupyter tokens too: the user's sandbox VM has the same name (forja-l4), and its token
    # file in ~/.config/forja/tokens must stay the user's.
    with (folder / "group_vars" / "all" / "sandbox.yml").open("a") as out:
        name = "{{ inventory_hostname }}.jupyter-token"
        out.write("\n# The test run's own (tests/testsandbox.py): never the user's token file.\n"
                  f'jupyter_colab_token_fetch_path: "{tokens()}/{name}"\n')
    # The copy must say what the test sandbox serves: a port left unmoved would reach the user's.
    text = "\n".join(p.read_text() for p in folder.rglob("*.yml") if not p.is_symlink())
    assert not re.search(r":80(89|9[0-3])\b", text), "inventory/sandbox names a port the copy did not move"
    assert yaml.safe_load((folder / "gcp_gpu.yml").read_text())["api_url"] == service.base_url(PORT)
    return folder


def remove_leftovers() -> None:
    """Remove what an interrupted run left: the test sandbox (its service, VMs, state, buckets) and
    any other test host still up. The machine's own sandbox (its service, th10 … th19) is left
    alone. Called once per run, with the test hosts' lock held, after `env()` is in os.environ
    (tests/conftest.py)."""
    from forja_sandbox.backend import FIRST_INDEX, LAST_INDEX

    assert os.environ.get("FORJA_SANDBOX_PORT") == str(PORT), "the test sandbox's variables are not set"
    service.destroy()
    for index in testhosts.running():
        if not FIRST_INDEX <= index <= LAST_INDEX:
            testhosts.down(index)


@contextmanager
def vms_over_the_site_env() -> Iterator[None]:
    """The test sandbox's new VMs boot over the site-env layer (forja_sandbox/hostlayers.py) while the
    block runs: for tests whose subject is not the install (a cluster's training, a Spot VM's move).
    The first VM of the site e2e converges from scratch."""
    service.boot_over({"dlvm": hostlayers.site_env()})
    try:
        yield
    finally:
        service.boot_over(None)
