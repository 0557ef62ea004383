"""The learning rate as a pure function of the step (nanoGPT's ``get_lr``).

Why pure: a resumed run needs only the step to know its LR; there is no scheduler object whose
state could be forgotten in a checkpoint (a classic cause of resumed runs drifting).
"""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, total_steps: int, warmup_steps: int, min_lr: float, cosine: bool) -> float:
    """LR for optimizer step ``step`` (0-based): linear warm-up, then cosine to ``min_lr`` or constant."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if not cosine or total_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
