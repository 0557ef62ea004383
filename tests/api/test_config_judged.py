"""`forja train CONFIG` judges the config on the controller, with the trainer's own check, before any
host is contacted: each bad config of the drills is refused with exit 2, naming the file and the key.

The inventory names a host that cannot be reached (127.0.0.1, port 1): had forja tried to contact it
(0 SSH connections is the goal), the error would be HostUnreachable, not ConfigError. Nothing is
recorded in the history either.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from apihosts import REPO, write_inventory

from forja import errors
from forja.api import Forja
from forja.history import History

#: A host nothing answers on: contacting it would be HostUnreachable.
GHOST = {"ansible_host": "127.0.0.1", "ansible_port": 1}
DIGITS = yaml.safe_load((REPO / "trainer" / "configs" / "digits.yaml").read_text())

#: (case, what the file holds: a dict merged into the digits config, or raw bytes, what the message names)
CASES: list[tuple[str, dict | bytes, str]] = [
    # typos in keys
    ("steps typo", {"stpes": 300}, "stpes: unknown key (did you mean 'steps'?)"),
    ("batch typo", {"batchsize": 8}, "batchsize: unknown key (did you mean 'batch_size'?)"),
    ("schedule typo", {"lr_shedule": {}}, "lr_shedule: unknown key (did you mean 'lr_schedule'?)"),
    ("nested typo", {"lr_schedule": {"warmup": 10}}, "lr_schedule.warmup: unknown key"),
    ("optimiser", {"optimiser": "Adam"}, "optimiser: unknown key (did you mean 'optimizer'?)"),
    ("eval typo", {"eval_every": 10}, "eval_every: unknown key"),
    ("checkpoint typo", {"checkpoint_every": 60}, "checkpoint_every: unknown key"),
    ("model typo", {"modle": "trainer.demo:digits_cnn"}, "modle: unknown key (did you mean 'model'?)"),
    ("another tool's name", {"learning_rate": 0.1}, "learning_rate: unknown key"),
    ("finite typo", {"check_finite_every": 1}, "check_finite_every: unknown key"),
    # values out of range, of the wrong type, or that contradict each other
    ("zero steps", {"steps": 0}, "steps:"),
    ("negative steps", {"steps": -5}, "steps:"),
    ("steps as words", {"steps": "many"}, "steps: must be an integer (got 'many')"),
    ("zero lr", {"lr": 0}, "lr:"),
    ("negative lr", {"lr": -1}, "lr:"),
    ("zero batch", {"batch_size": 0}, "batch_size:"),
    ("batch as words", {"batch_size": "big"}, "batch_size:"),
    ("negative clip", {"grad_clip": -1}, "grad_clip:"),
    ("no checkpoints kept", {"keep_checkpoints": 0}, "keep_checkpoints:"),
    ("log every 0", {"log_every_steps": 0}, "log_every_steps:"),
    ("unknown precision", {"precision": "fp8"}, "precision:"),
    ("unknown device", {"device": "tpu"}, "device:"),
    ("fp16 on cpu", {"device": "cpu", "precision": "fp16"}, "precision: fp16 needs device cuda"),
    ("steps and epochs", {"steps": 100, "epochs": 2}, "steps/epochs: set one of them"),
    ("global batch", {"batch_size": 32, "effective_batch_size": 50}, "effective_batch_size: 50"),
    ("warm-up too long", {"lr_schedule": {"warmup_steps": 1000}}, "warmup_steps: 1000 must be < steps"),
    ("min_lr above lr", {"lr_schedule": {"min_lr": 1.0}}, "lr_schedule.min_lr: 1.0 is above lr"),
    ("not a gs:// bucket", {"checkpoint_bucket": "s3://mine"}, "checkpoint_bucket:"),
    ("bucket name", {"checkpoint_bucket": "gs://UPPER"}, "is not a Cloud Storage bucket name"),
    ("model without colon", {"model": "mymodel"}, "model: must be 'package.module:callable'"),
    ("loss_args alone", {"loss_args": {"weight": 1}}, "loss_args: given without loss"),
    ("negative skip budget", {"skip_nonfinite": -1}, "skip_nonfinite:"),
    ("check every 0", {"check_finite_every_steps": 0}, "check_finite_every_steps:"),
    ("zero loss bound", {"divergence_loss_bound": 0}, "divergence_loss_bound:"),
    ("one beta", {"betas": [0.9]}, "betas: too few items (item 2 is missing"),
    # files that are not a YAML mapping in UTF-8
    ("latin-1", "steps: 300\nnote: caf\xe9\n".encode("latin-1"), "is not UTF-8"),
    ("utf-16", "steps: 300\n".encode("utf-16"), "is not UTF-8"),
    ("binary junk", bytes(range(256)), "is not UTF-8"),
    ("a list", b"- steps: 300\n- lr: 0.1\n", "must hold a mapping of keys, got list"),
    ("a scalar", b"300\n", "must hold a mapping of keys, got int"),
    ("empty", b"", "is empty"),
    ("unclosed bracket", b"steps: [300\nlr: 0.1\n", "line 2"),
    ("tab indentation", b"lr_schedule:\n\twarmup_steps: 10\n", "line 2"),
]


@pytest.fixture(scope="module")
def ghost(tmp_path_factory: pytest.TempPathFactory) -> Forja:
    root = tmp_path_factory.mktemp("judged")
    inventory = write_inventory(root / "inv.yml", {"ghost": GHOST})
    return Forja(project_dir=root, inventory=inventory, host_key_checking=False,
                 private_data_dir=root / "runner", history=History(root / "h.sqlite"))  # fmt: skip


def write(path: Path, content: dict | bytes) -> Path:
    merged = content if isinstance(content, bytes) else yaml.safe_dump({**DIGITS, **content}).encode()
    path.write_bytes(merged)
    return path


def test_there_are_at_least_40_cases() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize(("content", "named"), [(c, n) for _, c, n in CASES], ids=[c for c, _, _ in CASES])
def test_a_bad_config_is_refused_on_the_controller_before_any_host(
    ghost: Forja, tmp_path: Path, content: dict | bytes, named: str
) -> None:
    path = write(tmp_path / "bad.yaml", content)
    with pytest.raises(errors.ConfigError) as info:
        ghost.train(path, name="judged")
    message = info.value.message
    assert info.value.field == "config" and info.value.exit_code == errors.ExitCode.USAGE == 2
    assert str(path) in message and "nothing was sent" in message and named in message, message
    assert ghost.history.list() == [], "a refused config records no run"


def test_the_command_line_exits_2_and_prints_what_to_fix(tmp_path: Path) -> None:
    path = write(tmp_path / "typo.yaml", {"stpes": 300})
    inventory = write_inventory(tmp_path / "inv.yml", {"ghost": GHOST})
    env = {**os.environ, "FORJA_HOME": str(tmp_path / "home")}
    forja = str(Path(sys.executable).with_name("forja"))
    done = subprocess.run([forja, "-i", str(inventory), "train", str(path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "stpes: unknown key (did you mean 'steps'?)" in done.stderr and "nothing was sent" in done.stderr
    assert "cost estimate" not in done.stdout + done.stderr, "no estimate for a config that is refused"


def test_the_command_line_says_what_only_the_run_s_start_can_check(tmp_path: Path) -> None:
    """A valid config is not a promise that it runs: the model, data and optimizer it names are
    imported where the run starts (torch, the user's code), and the command says so, in one line,
    before it sends anything (here to a host that cannot be reached: exit 3)."""
    path = write(tmp_path / "good.yaml", {"steps": 100, "model": "mynet.py:Net", "loss": "mynet.py:loss"})
    inventory = write_inventory(tmp_path / "inv.yml", {"ghost": GHOST})
    env = {**os.environ, "FORJA_HOME": str(tmp_path / "home")}
    forja = str(Path(sys.executable).with_name("forja"))
    done = subprocess.run([forja, "-i", str(inventory), "train", str(path), "--name", "said"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == errors.ExitCode.UNREACHABLE, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("good.yaml: ")]
    assert said == ["good.yaml: settings checked. Imported when the run starts, where torch and your "
                    "code are: model mynet.py:Net, data trainer.demo:digits, loss mynet.py:loss, "
                    "optimizer AdamW"], done.stderr


def test_a_good_config_passes_the_check_and_goes_on_to_the_host(ghost: Forja, tmp_path: Path) -> None:
    """The control: the same path with a valid config reaches the (unreachable) host."""
    path = write(tmp_path / "good.yaml", {"steps": 100})
    with pytest.raises(errors.HostUnreachable):
        ghost.train(path, name="judged-good")
