"""The built-in trainer's config, judged on the controller before anything is sent.

Why here and not only on the VM: a typo'd key, a file that is not UTF-8 or a YAML list used to be
bundled, sent, installed as a unit and refused only by the trainer on the VM, minutes and a
playbook later (and a non-UTF-8 file exited 1, which systemd restarts five times). The check is
the trainer's own (:func:`trainer.config.load`, the same code the VM runs again), so the two can
never disagree. It needs pydantic and PyYAML only, which forja has: no torch, and the user's model
and data are not imported (the VM does that, and a failure there is exit 4, not restarted).
"""

from __future__ import annotations

from pathlib import Path

from forja import errors


def judge(path: Path) -> None:
    """Raise ConfigError (field "config", exit 2) naming the file and every problem the trainer finds."""
    from trainer.config import ConfigError, load

    try:
        load(path)
    except ConfigError as exc:
        problems = "\n".join(f"  - {p}" for p in exc.problems)
        raise errors.ConfigError(
            "config", f"{path} is not a valid trainer config; nothing was sent:\n{problems}"
        ) from None
