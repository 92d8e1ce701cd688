"""One training step of one process: compute, communication and the optimizer, in order.

    before_step(strategy, step)                              (ps: the step's number)
    autocast: loss = strategy.forward_backward(x, y)        (loss x scale under fp16;
              --accumulate K: strategy.accumulated(x, y), K micro-batches)
    fp16: unscale the gradients, agree on overflow across workers
    strategy.after_backward()   -> optimizer.step() -> strategy.after_step(step)
    (an agreed skip instead:       skipped_step(strategy, step))

Under fp16 an overflow on any rank makes every rank skip the same step and
back off the same scale (:class:`disttrain.amp.LossScaler`). Strategies that
communicate during backward (``SendsDuringBackward``) reduce scaled
gradients; since the reduction is a sum, they are unscaled afterwards, and the
reduced values already carry any rank's Inf/NaN to every rank.

``--check-finite`` (not under fp16) checks what this rank sends before it leaves
(:mod:`disttrain.train.faults`): each bucket before its allreduce for strategies
that send during backward, the gradients after backward for the others, and each
layer's output in forward for model parallelism.
"""

from __future__ import annotations

import time

import torch

from disttrain import amp, timeline
from disttrain.config import TrainConfig
from disttrain.dataparallel.fusion import FlatBucket
from disttrain.strategies import Strategy, get
from disttrain.strategies.capabilities import (
    Accumulates,
    SendsDuringBackward,
    before_step,
    communicates_during_backward,
    skipped_step,
)
from disttrain.train.faults import ActivationGuard, Fault, check_bucket, check_gradients
from disttrain.train.metrics import Timers

__all__ = ["StepRunner"]


class StepRunner:
    """Runs steps for one strategy, timing compute and communication separately."""

    def __init__(
        self,
        strategy: Strategy,
        optimizer: torch.optim.Optimizer,
        tc: TrainConfig,
        timers: Timers,
        fault: Fault | None,
        rank: int,
    ) -> None:
        self.strategy = strategy
        self.optimizer = optimizer
        self.timers = timers
        self.fault = fault
        self.rank = rank
        self.device = strategy.world.device
        self.precision = tc.precision
        self.scaler: amp.LossScaler | None = None
        if tc.precision == "fp16":
            self.scaler = amp.LossScaler(
                tc.loss_scale,
                tc.scale_growth,
                tc.scale_backoff,
                tc.scale_growth_interval,
                tc.max_skipped_steps,
            )
            plain = strategy.loss_fn
            scaler = self.scaler
            strategy.loss_fn = lambda out, y: plain(out, y) * scaler.scale
        self.skipped_steps = 0
        self.step = 0  # the step being run, for the checks' messages
        if fault:
            fault.install(strategy.model)  # before the guard: its hook must see the NaN
        check_finite = tc.check_finite and self.scaler is None
        self.guard: ActivationGuard | None = None
        if check_finite and get(strategy.name).shares_activations:
            self.guard = ActivationGuard(strategy.model, rank)
        self._names = {id(p): n for n, p in strategy.model.named_parameters()}
        # gradients sent during backward are checked bucket by bucket before they leave;
        # after backward they are sums of every rank's (views of the buckets), not ours
        self.check_after_backward = check_finite and not (
            isinstance(strategy, SendsDuringBackward)
            and strategy.communicates_during_backward
            and strategy.check_before_send(self._check)
        )

    def _check(self, bucket: FlatBucket) -> None:
        check_bucket(bucket, self._names, self.rank, self.step)

    def _overflow(self) -> bool:
        assert self.scaler is not None
        params = (p for g in self.optimizer.param_groups for p in g["params"])
        return self.scaler.agree(self.scaler.unscale_(params), self.strategy.roles.worker_group)

    def run(self, step: int, x: torch.Tensor, y: torch.Tensor) -> tuple[float, bool]:
        """Train on (x, y) as step ``step``; return the loss and whether the step was skipped."""
        strategy, fault = self.strategy, self.fault
        if fault:
            fault.before_step(self.rank, step)
        self.step = step
        before_step(strategy, step)
        if fault:
            fault.before_forward(self.rank, step)
        if self.guard:
            self.guard.begin(step)
        start = time.perf_counter()
        try:
            with self.timers.time("compute"):
                self.optimizer.zero_grad(set_to_none=True)
                with amp.autocast(self.precision, self.device):
                    if isinstance(strategy, Accumulates) and strategy.accumulate > 1:
                        loss = strategy.accumulated(x, y)
                    else:
                        loss = strategy.forward_backward(x, y)
        finally:
            if fault:
                fault.after_forward()
            if self.guard:
                self.guard.end()
        if fault:
            fault.after_compute(self.rank, step, time.perf_counter() - start)
            fault.after_backward(self.rank, step, strategy.model)
        if self.check_after_backward:  # under fp16 the scaler's agreed skip handles them
            check_gradients(strategy.model, self.rank, step)
        scale = self.scaler.scale if self.scaler else 1.0
        skip = False
        during = communicates_during_backward(strategy)
        with self.timers.time("communication"), timeline.span("sync"):
            if self.scaler and not during:
                skip = self._overflow()
            if not skip:
                strategy.after_backward()
            if self.scaler and during:
                skip = self._overflow()
        if not skip:
            with self.timers.time("compute"), timeline.span("optimizer"):
                self.optimizer.step()
            with self.timers.time("communication"):
                strategy.after_step(step)
        else:
            with self.timers.time("communication"):
                skipped_step(strategy, step)
        if self.scaler:
            self.scaler.update(skip)
        self.skipped_steps += skip
        return float(loss.item()) / scale, skip
