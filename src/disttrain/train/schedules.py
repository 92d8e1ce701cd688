"""Learning-rate rules for large batches: linear scaling, gradual warm-up, then a decay.

Linear scaling (Goyal et al. 2017): with a global batch B the target rate is
``lr * B / base_batch_size``. Gradual warm-up ramps linearly from ``lr`` (the
small-batch rate; from lr/warmup_steps without scaling) to the target over the
warm-up epochs, avoiding the early instability of a large rate. After it, the
rate decays over the remaining steps: ``cosine`` (to 0, Loshchilov & Hutter
2017), ``exponential`` (x gamma per epoch), ``step`` (x gamma every
``lr_step_epochs``), or ``constant``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["LR_SCHEDULES", "LRSchedule"]

LR_SCHEDULES = ("constant", "cosine", "exponential", "step")


@dataclass(frozen=True)
class LRSchedule:
    """The learning rate at each step (counted from 0) of a run."""

    lr: float
    global_batch: int
    total_steps: int
    steps_per_epoch: int
    scaling: str = "none"  # "none" or "linear"
    base_batch_size: int = 64
    warmup_epochs: float = 0.0
    schedule: str = "constant"
    gamma: float = 0.0  # 0: the schedule's default (0.9 per epoch exponential, 0.1 per step)
    step_epochs: int = 30

    @classmethod
    def for_run(cls, tc: Any, total_steps: int, steps_per_epoch: int) -> LRSchedule:
        """The schedule a run's settings (``TrainConfig``) describe."""
        return cls(
            tc.lr,
            tc.batch_size,
            total_steps,
            steps_per_epoch,
            tc.lr_scaling,
            tc.base_batch_size,
            tc.warmup_epochs,
            tc.lr_schedule,
            tc.lr_gamma,
            tc.lr_step_epochs,
        )

    @property
    def target(self) -> float:
        if self.scaling == "linear":
            return self.lr * self.global_batch / self.base_batch_size
        return self.lr

    @property
    def warmup_steps(self) -> int:
        return round(self.warmup_epochs * self.steps_per_epoch)

    def __call__(self, step: int) -> float:
        warm = self.warmup_steps
        if step < warm:
            start = self.lr if self.scaling == "linear" else self.target / warm
            return start + (self.target - start) * step / warm
        epoch = step / max(self.steps_per_epoch, 1)
        if self.schedule == "cosine":
            span = max(self.total_steps - warm, 1)
            return self.target * 0.5 * (1.0 + math.cos(math.pi * min(step - warm, span) / span))
        if self.schedule == "exponential":
            return self.target * (self.gamma or 0.9) ** (epoch - self.warmup_epochs)
        if self.schedule == "step":
            return self.target * (self.gamma or 0.1) ** int(epoch // self.step_epochs)
        return self.target
