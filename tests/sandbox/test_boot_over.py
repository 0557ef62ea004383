"""Which layer the sandbox's new VMs boot over (`service.boot_over`, read by the backend at each create):
none unless a test names one, and a layer that is not there is refused before anything is written.
Booting over a layer is tests/foundation/test_testhosts.py's; the tests that use this are the
cluster's and the Spot drill's."""

from __future__ import annotations

from pathlib import Path

import pytest

from forja_sandbox import backend as sandbox_backend
from forja_sandbox import service


@pytest.fixture
def sandbox_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FORJA_SANDBOX_DIR", str(tmp_path / "sandbox"))
    return tmp_path / "sandbox"


def test_a_named_layer_is_booted_over_by_image_until_it_is_cleared(sandbox_dir: Path, tmp_path: Path) -> None:
    backend = sandbox_backend.TestHostBackend(sandbox_dir / "host-bindings.json",
                                              boot_over_file=service.paths().boot_over)
    assert backend.boot_over("dlvm") is None  # the default: a VM installs everything, as on Google Cloud

    layer = tmp_path / "site-env-abc"
    layer.mkdir()
    service.boot_over({"dlvm": layer})
    assert backend.boot_over("dlvm") == layer  # read at each create: the running service needs no restart
    assert backend.boot_over("golden") is None

    service.boot_over(None)
    assert backend.boot_over("dlvm") is None
    assert not service.paths().boot_over.exists()


def test_a_missing_layer_is_refused_and_nothing_changes(sandbox_dir: Path, tmp_path: Path) -> None:
    layer = tmp_path / "site-env-abc"
    layer.mkdir()
    service.boot_over({"dlvm": layer})
    before = service.paths().boot_over.read_text()
    with pytest.raises(FileNotFoundError, match=r"no such layer to boot over: dlvm: .*/gone"):
        service.boot_over({"dlvm": tmp_path / "gone"})
    assert service.paths().boot_over.read_text() == before


def test_destroying_the_sandbox_forgets_the_layer(sandbox_dir: Path, tmp_path: Path) -> None:
    layer = tmp_path / "site-env-abc"
    layer.mkdir()
    service.boot_over({"dlvm": layer})
    service.destroy()
    assert not service.paths().boot_over.exists()
