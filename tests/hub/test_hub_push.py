"""`forja model push`: an exported model to the Hugging Face Hub with huggingface_hub's own client.

The Hub cannot be reached from here: these tests run the real client (pinned in pyproject.toml)
against forja_sandbox/hub_standin.py, a local stand-in for the HTTP endpoints it calls (whoami,
create_repo, preupload, LFS batch/upload/verify, commit, resolve). Where the stand-in differs from
the Hub: forja_sandbox/README.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError
from safetensors.torch import save_file

from forja import errors
from forja.api import Forja
from forja.history import History
from forja.hub import TOKENS_PAGE, push_model, read_token
from forja_sandbox.hub_standin import HubStandIn, Token
from trainer import run_folder
from trainer.demo import digits_cnn
from trainer.export import CONFIG, WEIGHTS, export_state, load_model, load_state, sha256_file

REPO = Path(__file__).resolve().parents[2]
TOKENS = {
    "hf_alice_write": Token("alice", "write", orgs=("lab",)),
    "hf_bob_read": Token("bob", "read"),
    "hf_carol_fine": Token("carol", "fineGrained", orgs=("lab",), write_namespaces=("carol",)),
}


@pytest.fixture
def hub() -> Iterator[HubStandIn]:
    with HubStandIn(TOKENS) as running:
        yield running


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A real export of a small digits CNN (what a finished run leaves in model/)."""
    torch.manual_seed(0)
    model = digits_cnn(width=4, hidden=8)
    config = {"model": "trainer.demo:digits_cnn", "model_args": {"width": 4, "hidden": 8}}
    folder = tmp_path / "run" / run_folder.MODEL_DIR
    return export_state(model.state_dict(), config, folder, step=7, run="run").folder


def outputs(model: torch.nn.Module) -> torch.Tensor:
    torch.manual_seed(1)
    with torch.no_grad():
        return model.eval()(torch.rand(3, 1, 8, 8))


def test_a_pushed_model_downloads_with_the_hubs_client_and_loads_with_the_same_outputs(
    hub: HubStandIn, model_dir: Path, tmp_path: Path
) -> None:
    pushed = push_model(model_dir, "alice/digits", token="hf_alice_write", endpoint=hub.url)
    assert pushed.user == "alice" and pushed.step == 7 and pushed.url == f"{hub.url}/alice/digits"
    assert ("PUT", f"/lfs-upload/{pushed.sha256}", 200) in hub.requests  # the weights went through LFS

    fetched = tmp_path / "fetched"
    for name in (WEIGHTS, CONFIG):
        path = hf_hub_download("alice/digits", name, endpoint=hub.url, token="hf_alice_write",
                               cache_dir=tmp_path / "cache", local_dir=fetched)  # fmt: skip
        assert Path(path).read_bytes() == (model_dir / name).read_bytes()
    assert torch.equal(outputs(load_model(fetched)), outputs(load_model(model_dir)))


def test_pushing_the_same_model_again_uploads_nothing(hub: HubStandIn, model_dir: Path) -> None:
    first = push_model(model_dir, "alice/digits", token="hf_alice_write", endpoint=hub.url)
    before = len(hub.requests)
    second = push_model(model_dir, "alice/digits", token="hf_alice_write", endpoint=hub.url)
    assert second.commit == first.commit
    assert not [r for r in hub.requests[before:] if r[0] == "PUT" or r[1].endswith("/commit/main")]


def test_a_read_only_token_is_refused_naming_the_repo_and_the_fix_before_anything_is_created(
    hub: HubStandIn, model_dir: Path
) -> None:
    with pytest.raises(errors.ConfigError) as raised:
        push_model(model_dir, "bob/digits", token="hf_bob_read", endpoint=hub.url)
    message = raised.value.message
    assert "'bob' cannot write to bob/digits" in message and "read-only" in message
    assert TOKENS_PAGE in message and "HF_TOKEN" in message
    assert [r[1] for r in hub.requests] == ["/api/whoami-v2"] and not hub.repos


def test_the_stand_in_answers_a_write_without_rights_with_the_hubs_403_as_the_client_sees_it(
    hub: HubStandIn,
) -> None:
    api = HfApi(endpoint=hub.url)
    with pytest.raises(HfHubHTTPError) as raised:
        api.create_repo("lab/digits", token="hf_carol_fine")
    assert raised.value.response.status_code == 403
    assert '403 Forbidden: You don\'t have the rights to create a model under the namespace "lab"' in str(
        raised.value
    )


def test_a_fine_grained_token_without_write_on_an_existing_repo_gets_an_error_naming_it(
    hub: HubStandIn, model_dir: Path
) -> None:
    push_model(model_dir, "lab/digits", token="hf_alice_write", endpoint=hub.url)
    with pytest.raises(errors.ConfigError) as raised:
        push_model(model_dir, "lab/digits", token="hf_carol_fine", endpoint=hub.url)
    message = raised.value.message
    assert "'carol' cannot write to lab/digits" in message and "403" in message
    assert "'repo.write' on that namespace" in message and TOKENS_PAGE in message
    assert hub.files("lab/digits")[WEIGHTS] == (model_dir / WEIGHTS).read_bytes()  # unchanged


def test_an_unknown_token_is_a_401_error_that_says_how_to_get_one(hub: HubStandIn, model_dir: Path) -> None:
    with pytest.raises(errors.ConfigError, match=r"rejected the token \(401"):
        push_model(model_dir, "alice/digits", token="hf_nobody", endpoint=hub.url)


def test_a_model_with_nan_weights_is_refused_before_any_request(hub: HubStandIn, model_dir: Path) -> None:
    """A hand-made model folder: NaN weights with a model.json whose sha256 matches them."""
    state = load_state(model_dir)
    name = next(iter(state))
    state[name] = state[name].clone().fill_(float("nan"))
    save_file(state, str(model_dir / WEIGHTS))
    info = json.loads((model_dir / CONFIG).read_text())
    (model_dir / CONFIG).write_text(json.dumps({**info, "sha256": sha256_file(model_dir / WEIGHTS)}))
    with pytest.raises(errors.ConfigError, match=f"NaN or infinite values \\({name}\\)") as info_:
        push_model(model_dir, "alice/digits", token="hf_alice_write", endpoint=hub.url)
    assert info_.value.field == "model"
    assert hub.requests == [], "nothing reached the Hub"


def test_a_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("hf_alice_write\n")
    token_file.chmod(0o644)
    with pytest.raises(errors.ConfigError, match="readable by others; chmod 600"):
        read_token(token_file, env={})
    token_file.chmod(0o600)
    assert read_token(token_file, env={"HF_TOKEN": "other"}) == "hf_alice_write"


def test_a_run_without_fetched_results_is_not_found(tmp_path: Path) -> None:
    forja = Forja(tmp_path, history=History(tmp_path / "history.sqlite"))
    with pytest.raises(errors.RunNotFound, match="forja fetch nope"):
        forja.model_push("nope", "alice/digits")


def forja_cli(*args: str, project: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "FORJA_HOME": str(project / ".forja"), **env}
    full_env.pop("FORJA_INVENTORY", None)
    return subprocess.run(
        [str(Path(sys.executable).parent / "forja"), *args], cwd=project, env=full_env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_forja_model_push_finds_the_fetched_model_takes_the_token_from_the_environment_and_never_shows_it(
    hub: HubStandIn, model_dir: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    fetched = project / "forja-runs" / "run1" / "forja-l4"
    fetched.mkdir(parents=True)
    model_dir.rename(fetched / run_folder.MODEL_DIR)
    (fetched / run_folder.SUMMARY).write_text(json.dumps({"status": "completed"}))

    done = forja_cli("--json", "model", "push", "run1", "--repo", "alice/cli", project=project,
                     HF_TOKEN="hf_alice_write", HF_ENDPOINT=hub.url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["repo"] == "alice/cli"
    assert "hf_alice_write" not in done.stdout + done.stderr
    assert set(hub.files("alice/cli")) == {WEIGHTS, CONFIG}

    refused = forja_cli("model", "push", "run1", "--repo", "bob/cli", project=project,
                        HF_TOKEN="hf_bob_read", HF_ENDPOINT=hub.url)  # fmt: skip
    assert refused.returncode == int(errors.ExitCode.USAGE)
    assert "bob/cli" in refused.stderr and "hf_bob_read" not in refused.stdout + refused.stderr
