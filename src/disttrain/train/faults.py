"""Fault injection for tests and demos: ``--inject-fault KIND:rank=R:step=T``.

Kinds: ``kill`` (SIGKILL itself), ``raise`` (a RuntimeError), ``hang`` (sleep
forever), ``slow:FACTOR`` (sleep FACTOR-1 times the step's compute time),
``nan`` (poison its gradients), ``inf`` (one gradient element becomes +Inf, at
step T only: an fp16 overflow on one rank). The fault fires on rank R at step T
(from 1) and says so on stderr (tests time the job's end from that line).

:func:`check_gradients` is the guard the ``nan`` fault exercises: every step,
after backward and before the step's synchronisation, a worker whose own
gradients hold NaN or Inf stops with an error naming its rank and the
parameter, instead of training on with NaN in every replica. With ``--overlap``
the buckets sent during backward have already left; the job still ends there.
fp16 runs skip the check: the loss scaler's agreed skip handles overflow there.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

from disttrain.comm.errors import DisttrainError, UsageError

__all__ = ["Fault", "NonFiniteGradient", "check_gradients", "parse_fault"]


class NonFiniteGradient(DisttrainError):
    """A worker's own gradients hold NaN or Inf: the message names the rank and parameter."""


def check_gradients(model: nn.Module, rank: int, step: int) -> None:
    """Raise :class:`NonFiniteGradient` if any local gradient of ``model`` is not finite.

    One fused norm per step (``_foreach_norm``): NaN/Inf propagate into it; a huge
    but finite gradient can overflow it too, so a non-finite total is confirmed
    parameter by parameter before raising.
    """
    named = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]
    if not named:
        return
    norms = torch._foreach_norm([g for _, g in named])
    if bool(torch.isfinite(torch.stack(norms).sum())):
        return
    for name, grad in named:
        if not bool(torch.isfinite(grad).all()):
            raise NonFiniteGradient(
                f"rank {rank} computed a non-finite gradient for {name} at step {step}; "
                f"stopping this worker"
            )


KINDS = ("kill", "raise", "hang", "slow", "nan", "inf")


@dataclass(frozen=True)
class Fault:
    """One injected fault: what, on which rank, from which step."""

    kind: str
    rank: int
    step: int
    factor: float = 1.0

    def fires(self, rank: int, step: int) -> bool:
        # only in the first round: a job restarted by --max-restarts should recover
        if rank != self.rank or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return False
        # slow and nan persist from their step on; the others fire once
        return step >= self.step if self.kind in ("slow", "nan") else step == self.step

    def _announce(self, rank: int, step: int) -> None:
        if step == self.step:
            sys.stderr.write(
                f"disttrain: rank {rank}: injecting fault {self.kind} at step {step}\n"
            )
            sys.stderr.flush()

    def before_step(self, rank: int, step: int) -> None:
        if not self.fires(rank, step):
            return
        if self.kind in ("kill", "raise", "hang"):
            self._announce(rank, step)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "raise":
            raise RuntimeError(f"injected fault on rank {rank} at step {step}")
        if self.kind == "hang":
            while True:
                time.sleep(3600)

    def after_compute(self, rank: int, step: int, compute_seconds: float) -> None:
        if self.kind == "slow" and self.fires(rank, step):
            self._announce(rank, step)
            time.sleep(compute_seconds * (self.factor - 1.0))

    def after_backward(self, rank: int, step: int, model: nn.Module) -> None:
        if self.kind == "nan" and self.fires(rank, step):
            self._announce(rank, step)
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
                    break
        if self.kind == "inf" and self.fires(rank, step):
            for p in model.parameters():
                if p.grad is not None and p.grad.numel():
                    p.grad.view(-1)[0] = float("inf")  # a single element, on this rank only
                    break


def parse_fault(spec: str) -> Fault | None:
    """Parse ``kill:rank=1:step=5`` or ``slow:4:rank=3:step=1``; empty means none."""
    if not spec:
        return None
    parts = spec.split(":")
    kind, rest = parts[0], parts[1:]
    if kind not in KINDS:
        raise UsageError(f"--inject-fault {spec!r}: kind must be one of {', '.join(KINDS)}")
    factor = 1.0
    if kind == "slow":
        try:
            factor = float(rest.pop(0))
        except (IndexError, ValueError):
            raise UsageError(f"--inject-fault {spec!r}: use slow:FACTOR:rank=R:step=T") from None
        if factor < 1.0:
            raise UsageError(f"--inject-fault {spec!r}: FACTOR must be >= 1")
    fields: dict[str, int] = {}
    for item in rest:
        key, _, value = item.partition("=")
        if key not in ("rank", "step") or not value.isdigit():
            raise UsageError(f"--inject-fault {spec!r}: expected rank=R and step=T, got {item!r}")
        fields[key] = int(value)
    if "rank" not in fields:
        raise UsageError(f"--inject-fault {spec!r}: name the rank with rank=R")
    return Fault(kind, fields["rank"], max(1, fields.get("step", 1)), factor)
