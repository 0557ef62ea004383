"""The built-in trainer's config, judged on the controller before anything is sent.

Why here and not only on the VM: a typo'd key, a file that is not UTF-8 or a YAML list used to be
bundled, sent, installed as a unit and refused only by the trainer on the VM, minutes and a
playbook later (and a non-UTF-8 file exited 1, which systemd restarts five times). The check is
the trainer's own (:func:`trainer.config.load`, the same code the VM runs again), so the two can
never disagree. It needs pydantic and PyYAML only, which forja has: no torch, and the user's model
and data are not imported (the VM does that, and a failure there is exit 4, not restarted).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forja import errors


@dataclass(frozen=True)
class Judged:
    """A config the controller found valid, and what of it only the run's start can check.

    Said so that "checked" does not read as "will run": the code the config names needs torch and
    the user's project, which the controller need not have, and importing it would run the user's
    code here. The VM (or Vertex replica) imports it; a failure there is exit 4, not restarted.
    """

    path: Path
    #: What the host imports when the run starts, as the config names it ("model pkg.mod:net").
    unchecked: tuple[str, ...]

    @property
    def said(self) -> str:
        """The one line `forja train` prints (--json has `unchecked` instead)."""
        return (f"{self.path.name}: settings checked. Imported when the run starts, where torch and your "
                f"code are: {', '.join(self.unchecked)}")


def unchecked(config: Any) -> tuple[str, ...]:
    """What of a trainer.config.TrainConfig only the host can check: the code and names it imports."""
    named = {"model": config.model, "data": config.data,
             "loss": None if config.loss == "auto" else config.loss, "collate": config.collate,
             "optimizer": config.optimizer, "scheduler": config.lr_schedule.scheduler}  # fmt: skip
    return tuple(f"{what} {value}" for what, value in named.items() if value)


def judge(path: Path) -> Judged:
    """Raise ConfigError (field "config", exit 2) naming the file and every problem the trainer finds;
    else say what only the host can check (`Judged`)."""
    from trainer.config import ConfigError, load

    try:
        config = load(path)
    except ConfigError as exc:
        problems = "\n".join(f"  - {p}" for p in exc.problems)
        raise errors.ConfigError(
            "config", f"{path} is not a valid trainer config; nothing was sent:\n{problems}"
        ) from None
    return Judged(path, unchecked(config))
