"""A played TrialRunner for the sweep loop's own tests, and the small study they run.

The runner answers each trial's looks (and its recoveries) from a script, what its run or VM would
say: what these tests prove is the loop's policy (budget, recoveries, the status table) through real
Optuna; the runners' side is proven by the local sweep's real trainer runs (test_sweep_local.py) and
on the host tier."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from forja.sweep import SweepSpec
from forja.sweep_runners import WAIT, Look, Recovery

TINY = {"model": "trainer.demo:digits_cnn", "data": "trainer.demo:digits", "steps": 30}


class Played:
    """Answers each trial's looks, and each recovery, from a script; `slots` played GPUs."""

    ahead = 0

    def __init__(self, looks: dict[int, list[Look]], recoveries: dict[int, list[Recovery]] | None = None,
                 slots: int = 1) -> None:
        self.looks, self.recoveries, self._slots = looks, recoveries or {}, slots
        self.asked_to_recover: list[str] = []

    def slots(self) -> int:
        return self._slots

    def describe(self) -> str:
        return f"{self._slots} played GPU(s)"

    def start(self, run: str, config: Path, slot: int) -> None:
        pass

    def adopt(self, run: str, config: Path, slot: int) -> None:
        pass

    def look(self, runs: Sequence[str]) -> dict[str, Look]:
        return {run: self.looks[int(run[-3:])].pop(0) for run in runs}

    def stop(self, run: str) -> Look | None:
        return None

    def recover(self, run: str, slot: int) -> Recovery:
        self.asked_to_recover.append(run)
        script = self.recoveries.get(int(run[-3:]))
        return script.pop(0) if script else WAIT

    def model_of(self, run: str) -> Path | None:
        return None


def tiny_spec(tmp_path: Path, name: str, **fields: Any) -> SweepSpec:
    """A sweep of the digits demo over the learning rate, its folder made as `forja sweep` makes it."""
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"params": {"lr": {"type": "float", "low": 0.001,
                                                                           "high": 0.1}}}))
    spec = SweepSpec(name=name, config=str(tmp_path / "tiny.yaml"), space=str(tmp_path / "space.yaml"),
                     **fields)
    spec.folder.mkdir(parents=True)
    shutil.copyfile(spec.config, spec.config_copy)
    shutil.copyfile(spec.space, spec.space_copy)
    return spec
