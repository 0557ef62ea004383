"""Exit codes: the contract between a training process and systemd (the trainer_run role).

The unit restarts a run only when a restart can help: a crash (1) or a preemption after a clean
save (3). Every code in ``NO_RESTART`` means "a restart would fail the same way": the unit lists
them in ``RestartPreventExitStatus`` and forja reports them with the hint below. A user's own
script launched by forja may use the same codes (``trainer.runlib`` exposes them).
"""

from __future__ import annotations

COMPLETED = 0
#: Anything else: a crash, a lost peer. Restarting resumes from the newest checkpoint.
FAILED = 1
#: The config or the arguments were rejected, or a resume found them changed in an unsafe way.
BAD_CONFIG = 2
#: Stopped by SIGTERM after a clean checkpoint (Spot preemption, `forja stop`): restart to resume.
PREEMPTED = 3
#: The user's code or data raised (import error, missing data file, bad model arguments).
USER_ERROR = 4
#: Checkpoints exist but none passed verification, and a fresh start was not allowed.
NO_VALID_CHECKPOINT = 5
#: The disk is full: nothing can be saved until space is freed.
DISK_FULL = 6
#: The loss became NaN, infinite or larger than ``divergence_loss_bound``: the same weights and
#: data would diverge again, so a restart cannot help (lower the LR, or resume an earlier checkpoint).
DIVERGED = 7
#: Another run holds the output folder's lock (the launcher's, or the trainer's own: trainer.folder_lock).
LOCKED = 75

NO_RESTART: tuple[int, ...] = (BAD_CONFIG, USER_ERROR, NO_VALID_CHECKPOINT, DISK_FULL, DIVERGED, LOCKED)

#: What each code means, for people (forja's status, the role's failure message).
MEANING: dict[int, str] = {
    COMPLETED: "completed",
    FAILED: "failed; a restart resumes from the newest checkpoint",
    BAD_CONFIG: "the config or arguments were rejected",
    PREEMPTED: "preempted after a clean checkpoint",
    USER_ERROR: "the user's code or data raised an error; a restart cannot fix it",
    NO_VALID_CHECKPOINT: "no checkpoint passed verification",
    DISK_FULL: "the disk is full",
    DIVERGED: "the loss diverged (NaN, infinite or over divergence_loss_bound); a restart cannot fix it",
    LOCKED: "another run holds the output folder; a restart cannot fix this",
}
