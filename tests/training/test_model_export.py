"""The trained model out of forja's checkpoint format: safetensors + model.json (trainer.export).

Real runs on CPU; the export is loaded in a fresh Python process and must give the same outputs as
the checkpoint it came from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_helpers import REPO, subprocess_env, tiny_digits

from trainer import run_folder
from trainer.checkpoint import CheckpointManager
from trainer.config import validate
from trainer.demo import digits_cnn
from trainer.export import CONFIG, WEIGHTS, ExportError, export_run, load_model, sha256_file
from trainer.train import train

#: The child loads the export by itself and prints its outputs on a fixed input.
CHILD = """
import json, sys, torch
from trainer.export import load_model
model = load_model(sys.argv[1])
torch.manual_seed(0)
x = torch.rand(5, 1, 8, 8)
with torch.no_grad():
    print(json.dumps(model(x).tolist()))
"""


def outputs_of_checkpoint(run: Path, build: torch.nn.Module) -> torch.Tensor:
    found = CheckpointManager(run / run_folder.CHECKPOINTS_DIR).load_latest(quarantine=False)
    assert found is not None
    build.load_state_dict(found.state["model"])
    build.eval()
    torch.manual_seed(0)
    x = torch.rand(5, 1, 8, 8)
    with torch.no_grad():
        return build(x)


def outputs_in_fresh_process(folder: Path) -> torch.Tensor:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)], cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return torch.tensor(json.loads(done.stdout))


def test_a_finished_run_exports_a_model_that_a_fresh_process_loads_with_the_checkpoints_outputs(
    tmp_path: Path,
) -> None:
    result = train(validate(tiny_digits(tmp_path, steps=20)))
    run = tmp_path / "run"
    info = json.loads((run / run_folder.MODEL_DIR / CONFIG).read_text())
    assert info["model"] == "trainer.demo:digits_cnn" and info["model_args"] == {"width": 8, "hidden": 32}
    assert info["step"] == 20 and info["checkpoint"] == "ckpt-20.pt" and info["dtype"] == "float32"
    assert info["sha256"] == sha256_file(run / run_folder.MODEL_DIR / WEIGHTS)
    assert info["parameters"] == result.summary["params"] + 0  # the CNN has no buffers
    [event] = [e for e in map(json.loads, (run / run_folder.EVENTS).read_text().splitlines())
               if e["event"] == "export"]  # fmt: skip
    assert event["sha256"] == info["sha256"] and "error" not in event

    expected = outputs_of_checkpoint(run, digits_cnn(width=8, hidden=32))
    assert torch.equal(outputs_in_fresh_process(run / run_folder.MODEL_DIR), expected)


def test_tied_weights_are_stored_once_and_tied_again_on_load(tmp_path: Path) -> None:
    raw = tiny_digits(tmp_path, steps=6, model="export_models:TiedNet", model_args={},
                      export_model=False)  # fmt: skip
    train(validate(raw))
    exported = export_run(tmp_path / "run")
    stored = load_file(str(exported.folder / WEIGHTS))
    assert exported.info["tied"] == {"second.weight": "first.weight"}
    assert "second.weight" not in stored and "norm.running_mean" in stored

    model = load_model(exported.folder)
    assert model.second.weight is model.first.weight  # the module ties them; the load kept it so
    found = CheckpointManager(tmp_path / "run" / run_folder.CHECKPOINTS_DIR).load_latest(quarantine=False)
    assert found is not None
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, found.state["model"][name]), name


def test_export_on_request_takes_the_newest_checkpoint_that_verifies(tmp_path: Path) -> None:
    train(validate(tiny_digits(tmp_path, steps=20, checkpoint_every_steps=10, export_model=False)))
    run = tmp_path / "run"
    assert not (run / run_folder.MODEL_DIR).exists()
    newest = run / run_folder.CHECKPOINTS_DIR / "ckpt-20.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a bit flipped on disk after it was written
    newest.write_bytes(bytes(data))
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "export", str(run)], cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["checkpoint"] == "ckpt-10.pt"
    assert newest.exists()  # skipped, not set aside: a running trainer may own the folder
    assert load_model(run / run_folder.MODEL_DIR) is not None


def test_a_missing_run_and_a_run_without_checkpoints_are_errors_that_say_what_to_do(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainer", "export", str(tmp_path / "nope")], cwd=REPO,
        env=subprocess_env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert f"run folder {tmp_path / 'nope'} does not exist" in done.stderr
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match=r"has no checkpoint to export .*train it first"):
        export_run(tmp_path / "empty")


def test_weights_changed_after_the_export_are_refused(tmp_path: Path) -> None:
    train(validate(tiny_digits(tmp_path, steps=4)))
    weights = tmp_path / "run" / run_folder.MODEL_DIR / WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ExportError, match=r"is not model\.json's"):
        load_model(tmp_path / "run" / run_folder.MODEL_DIR)
