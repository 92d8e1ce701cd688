"""Local SGD (parameter averaging): workers step alone and average parameters every H steps.

Each worker runs its own optimizer on its shard of the global batch; every
``--period H`` steps the parameters (and with ``--average-optimizer-state``
the momentum / Adam moments too, at the cost of one or two more model-sized
allreduces) are averaged with ``--algorithm``: H times fewer bytes than
synchronous SGD. The seed material reports every 10 to 20 minibatches still
works. ``--warmup-sync-steps W`` first runs W steps of synchronous SGD
(gradient allreduce) and only then goes local: post-local SGD (Lin et al.,
"Don't use large mini-batches, use local SGD", ICLR 2020).

With H = 1 and plain or momentum SGD this is synchronous data parallelism:
the update is linear in the gradient and the momentum buffer, so the average
of the N locally stepped models (and of the N buffers) is the model (and
buffer) one synchronous step gives. Adam is not linear: H = 1 then differs.

An adaptive optimizer's local steps (Adam and the others of :data:`ADAPTIVE`) are taken
at ``lr·√N``, N the replicas averaged. Adam divides each coordinate by the root of its
own squared gradients, so every replica's step is about ``lr`` long whatever its
gradient's noise; where the noise dominates, the N replicas' steps point their own ways
and their average is about ``lr/√N`` long, while synchronous Adam's step (on the
averaged gradient) is ``lr``. Measured on tests/api/test_every_strategy.py's regression
(4 ranks, Adam lr 0.01, 80 steps, H = 16), see that module's figures. SGD and momentum
are linear in the gradient: nothing is scaled (H = 1 stays synchronous SGD). The
scale is applied around each local ``optimizer.step()`` (its pre-hook multiplies each
group's lr, its post-hook puts the same value back), so between steps, in
``optimizer.state_dict()``, a scheduler's reading and after ``finish()`` the user's
groups hold their own lr; the warm-up's synchronous steps are not scaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from disttrain import collectives, timeline
from disttrain.comm.errors import UsageError
from disttrain.comm.meter import meter
from disttrain.config import opt, register_section
from disttrain.dataparallel.average import average
from disttrain.dataparallel.buffers import average_buffers, floating_buffers
from disttrain.strategies.base import Strategy, register
from disttrain.strategies.capabilities import Reshards
from disttrain.strategies.settings import StrategySettings

__all__ = ["ADAPTIVE", "LocalSGD", "LocalSGDConfig", "LocalSGDSettings", "local_lr_scale"]

#: The optimizers whose step divides each coordinate by a running root (or maximum) of its
#: own squared gradients, so that a step is about lr long whatever the gradient's scale and
#: noise: their local steps are scaled by √N. The rule: an instance of one of these
#: (subclasses too), or an optimizer whose defaults hold ``betas`` (the Adam family's
#: convention outside torch: apex's FusedAdam, bitsandbytes' 8-bit Adam, Lion's sign step).
#: Not Muon: it normalises a whole matrix's update, not each coordinate (not measured).
ADAPTIVE: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adamax,
    torch.optim.SparseAdam,
    torch.optim.Adagrad,
    torch.optim.RMSprop,
    torch.optim.Adadelta,
    torch.optim.Adafactor,
)


def local_lr_scale(optimizer: torch.optim.Optimizer, replicas: int) -> float:
    """The factor local steps of ``optimizer`` take ``lr`` by when ``replicas`` replicas
    are averaged: √N for an adaptive optimizer (:data:`ADAPTIVE`'s rule), else 1."""
    adaptive = isinstance(optimizer, ADAPTIVE) or "betas" in optimizer.defaults
    return float(replicas) ** 0.5 if adaptive and replicas > 1 else 1.0


@register_section
@dataclass(frozen=True)
class LocalSGDConfig:
    """Settings of ``--strategy localsgd``."""

    period: int = opt(16, "localsgd, diloco: average parameters (diloco: outer step) every H steps")
    average_optimizer_state: bool = opt(
        False, "localsgd: also average momentum / Adam moments (costs more traffic)"
    )
    warmup_sync_steps: int = opt(0, "localsgd, diloco: synchronous SGD for the first W steps")
    adaptive_lr_scale: bool = opt(
        True,
        "localsgd, diloco: an adaptive optimizer's (adam...) local steps at lr x sqrt(workers)",
    )

    def validate(self) -> None:
        if self.period < 1:
            raise UsageError(f"--period must be >= 1, got {self.period}")
        if self.warmup_sync_steps < 0:
            raise UsageError(f"--warmup-sync-steps must be >= 0, got {self.warmup_sync_steps}")


def _optimizer_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Per-parameter state tensors shaped like their parameter, in a rank-independent order."""
    out: list[torch.Tensor] = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in sorted(state):
                v = state[key]
                if isinstance(v, torch.Tensor) and v.shape == p.shape and v.is_floating_point():
                    out.append(v)
    return out


class LocalSGDSettings(StrategySettings):
    """What local SGD reads: its period, warm-up and state averaging, and --algorithm."""

    main_setting: ClassVar[str | None] = "period"
    reads_settings: ClassVar[tuple[type[Any] | str, ...]] = (LocalSGDConfig, "algorithm")
    # the average by the cost model's table (docs/collectives.md, "--algorithm auto")
    setting_defaults: ClassVar[dict[str, Any]] = {"algorithm": "auto"}


# Reshards: replicas differ between averages, so a resume on M workers starts every worker
# from the average of the N saved replicas and optimizer states (an early average).
@register(settings=LocalSGDSettings, cost="disttrain.strategies.cost.localsgd:LocalSGDCost")
class LocalSGD(Strategy, Reshards):
    """Average parameters every ``--period`` steps; synchronous SGD for ``--warmup-sync-steps``."""

    name = "localsgd"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().setup(model, optimizer)
        self.settings: LocalSGDConfig = self.config.section(LocalSGDConfig)
        self.algorithm = collectives.build(self.config.train.algorithm, self.config)
        self.size = self.world.world_size
        self.steps_done = 0
        self.averaging_rounds = 0
        self.sync_steps = 0
        self.parameter_bytes = 0
        self.optimizer_state_bytes = 0
        self.gradient_bytes = 0
        self.buffer_bytes = 0
        self._last_average = 0
        on = self.settings.adaptive_lr_scale
        self.lr_scale = local_lr_scale(optimizer, self.size) if on else 1.0
        self._saved_lr: list[Any] = []
        self._hooks: list[RemovableHandle] = []
        if self.lr_scale != 1.0:
            self._hooks = [
                optimizer.register_step_pre_hook(self._scale_lr),
                optimizer.register_step_post_hook(self._restore_lr),
            ]
        # Replicas start equal: one average makes sure (outside the measured traffic).
        average(list(model.state_dict().values()), self.algorithm, world_size=self.size)

    def _scale_lr(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """Before a local step: each group's lr times :attr:`lr_scale` (not in warm-up)."""
        self._saved_lr = []
        if self.steps_done + 1 > self.settings.warmup_sync_steps:
            self._saved_lr = [group["lr"] for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * self.lr_scale

    def _restore_lr(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """After it: each group's own lr back, the very value (no division's rounding)."""
        if self._saved_lr:  # empty after a warm-up step: nothing was scaled
            for group, lr in zip(optimizer.param_groups, self._saved_lr, strict=True):
                group["lr"] = lr
        self._saved_lr = []

    def _params(self) -> list[torch.Tensor]:
        return [p for p in self.model.parameters()]

    def after_backward(self) -> None:
        if self.steps_done + 1 > self.settings.warmup_sync_steps:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        before = meter.bytes_sent
        average(grads, self.algorithm, world_size=self.size)
        self.gradient_bytes += meter.bytes_sent - before
        self.sync_steps += 1

    def _average(self) -> None:
        before = meter.bytes_sent
        with timeline.span("average parameters"):
            average(self._params(), self.algorithm, world_size=self.size)
        middle = meter.bytes_sent
        if self.settings.average_optimizer_state:
            average(_optimizer_state(self.optimizer), self.algorithm, world_size=self.size)
        self.parameter_bytes += middle - before
        self.optimizer_state_bytes += meter.bytes_sent - middle
        self._average_buffers()
        self.averaging_rounds += 1
        self._last_average = self.steps_done

    def _average_buffers(self, algorithm: collectives.Algorithm | None = None) -> None:
        """BatchNorm's running statistics averaged as the parameters are: each replica's
        estimate from its own shards, combined (left alone, each replica's own under the
        averaged weights: DiLoCo's eval-mode test loss of 64, against 1.4 with batch
        statistics). No message for a model without them. This thread's bytes alone
        (``meter.counting``): streaming DiLoCo's thread may be sending meanwhile."""
        if not floating_buffers(self.model):  # not even a span in the timeline
            return
        with meter.counting() as tally, timeline.span("average buffers"):
            average_buffers(self.model, algorithm or self.algorithm, world_size=self.size)
        self.buffer_bytes += tally.bytes_sent

    def after_step(self, step: int) -> None:
        self.steps_done = step
        local = step - self.settings.warmup_sync_steps
        if local > 0 and local % self.settings.period == 0:
            self._average()

    def finish(self) -> None:
        for hook in self._hooks:  # the user's optimizer steps at its own lr from now on
            hook.remove()
        self._hooks = []
        # The model evaluated and saved is the average, not rank 0's local replica.
        if self.steps_done > max(self._last_average, self.settings.warmup_sync_steps):
            self._average()
        elif self.steps_done > self._last_average:  # synchronous warm-up only: the
            self._average_buffers()  # parameters are equal, the statistics each rank's

    def step_metrics(self) -> dict[str, Any]:
        return {"averaging_rounds": self.averaging_rounds}

    def summary(self) -> dict[str, Any]:
        return {
            "period": self.settings.period,
            "warmup_sync_steps": self.settings.warmup_sync_steps,
            "average_optimizer_state": self.settings.average_optimizer_state,
            "local_lr_scale": self.lr_scale,  # √N for an adaptive optimizer's local steps
            "averaging_rounds": self.averaging_rounds,
            "sync_steps": self.sync_steps,
            "parameter_bytes_per_rank": self.parameter_bytes,
            "optimizer_state_bytes_per_rank": self.optimizer_state_bytes,
            "gradient_bytes_per_rank": self.gradient_bytes,
            "buffer_bytes_per_rank": self.buffer_bytes,
            **collectives.by_size(self.algorithm),  # --algorithm auto: what ran each size
        }

    def state_dict(self) -> dict[str, Any]:
        # the period clock: the step of the last average decides whether finish() averages
        return {
            "steps_done": self.steps_done,
            "averaging_rounds": self.averaging_rounds,
            "last_average": self._last_average,
            "sync_steps": self.sync_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps_done = int(state.get("steps_done", 0))
        self.averaging_rounds = int(state.get("averaging_rounds", 0))
        self._last_average = int(state.get("last_average", 0))
        self.sync_steps = int(state.get("sync_steps", 0))
