"""Fault injection for tests and demos: ``--inject-fault KIND:rank=R:step=T``.

Kinds: ``kill`` (SIGKILL itself), ``raise`` (a RuntimeError), ``hang`` (sleep
forever), ``stop`` (SIGSTOP itself: the whole process, its heartbeat thread too, until
a SIGCONT or SIGKILL), ``slow:FACTOR`` (sleep FACTOR-1 times the step's compute time),
``nan`` (the output of the model's first layer becomes NaN during forward, from
step T on, so the NaN flows through backward into the gradients as a real fault's
does), ``inf`` (one gradient element becomes +Inf, at step T only: an fp16
overflow on one rank). The fault fires on rank R at step T (from 1) and says so
on stderr (tests time the job's end from that line); ``rank=1+2`` names several ranks,
each of which fires at step T (two workers lost at once, for ``--min-workers``).

``--check-finite`` stops a worker whose *own* contribution holds NaN or Inf,
naming its rank, before that contribution leaves it (else the NaN reaches every
replica and whichever rank notices first is blamed):

- gradients sent during backward (the reducer's buckets): :func:`check_bucket`,
  on each bucket just before its allreduce is launched;
- gradients sent after backward: :func:`check_gradients`, before the step's
  synchronisation;
- activations sent to other ranks during forward (model parallelism):
  :class:`ActivationGuard`, on each layer's output, since the gradients of the
  others are poisoned too before backward ends.

fp16 runs skip the checks: the loss scaler's agreed skip handles overflow there.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from disttrain.comm.errors import DisttrainError, UsageError
from disttrain.dataparallel.fusion import FlatBucket

__all__ = [
    "ActivationGuard",
    "Fault",
    "NonFiniteGradient",
    "check_bucket",
    "check_gradients",
    "parse_fault",
]


class NonFiniteGradient(DisttrainError):
    """A worker's own gradients (or activations) hold NaN or Inf: the message names the rank
    and the parameter (or layer)."""


def _finite(t: torch.Tensor) -> bool:
    """True if every element of ``t`` is finite: one sum (NaN/Inf propagate into it), and
    only if that is not finite (a huge finite tensor can overflow it) a pass element-wise."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def check_bucket(bucket: FlatBucket, names: Mapping[int, str], rank: int, step: int) -> None:
    """Raise :class:`NonFiniteGradient` if this rank's share in ``bucket`` is not finite.

    Called by the reducer just before the bucket's allreduce is launched, so a rank's
    NaN never reaches the others' sums: the rank named is the one that computed it.
    ``names`` maps ``id(parameter)`` to its name.
    """
    if _finite(bucket.buffer):
        return
    for param, view in zip(bucket.tensors, bucket.views, strict=True):
        if not bool(torch.isfinite(view).all()):
            raise NonFiniteGradient(
                f"rank {rank} computed a non-finite gradient for "
                f"{names.get(id(param), 'a parameter')} (bucket {bucket.index}) at step "
                f"{step}; stopping this worker before sending it"
            )


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


class ActivationGuard:
    """Stop this rank when one of ``model``'s layers makes a non-finite output of finite inputs.

    For model parallelism, where activations (and their gradients) cross ranks
    within a step: a NaN made on one rank reaches every rank's gradients before
    backward ends, so the gradient check alone cannot tell whose it was. A
    forward hook on every leaf layer checks its output (one sum, see
    :func:`_finite`); a non-finite output whose floating inputs were all finite
    was made here. The model's own input is checked too (this rank's batch, or
    what a previous stage sent, which that stage checked). Active only between
    :meth:`begin` and :meth:`end`, i.e. not in evaluation.
    """

    def __init__(self, model: nn.Module, rank: int) -> None:
        self.rank = rank
        self.step = 0
        self.active = False
        self._handles = [model.register_forward_pre_hook(self._check_input)]
        for name, module in model.named_modules():
            if not any(True for _ in module.children()):  # a leaf: one layer
                label = f"{name or 'the model'} ({type(module).__name__})"
                self._handles.append(module.register_forward_hook(self._checker(label)))

    def begin(self, step: int) -> None:
        self.step, self.active = step, True

    def end(self) -> None:
        self.active = False

    def _fail(self, what: str) -> None:
        raise NonFiniteGradient(
            f"rank {self.rank} computed a non-finite {what} at step {self.step}; stopping "
            "this worker before sending it"
        )

    def _check_input(self, module: nn.Module, inputs: tuple[Any, ...]) -> None:
        del module
        if self.active and not all(_finite(t) for t in _floats(inputs)):
            self._fail("input")

    def _checker(self, label: str) -> Any:
        def hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            del module
            if not self.active or all(_finite(t) for t in _floats((output,))):
                return
            if all(_finite(t) for t in _floats(inputs)):
                self._fail(f"activation in {label}")

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _floats(values: tuple[Any, ...]) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]


KINDS = ("kill", "raise", "hang", "stop", "slow", "nan", "inf")


@dataclass
class Fault:
    """One injected fault: what, on which ranks, from which step."""

    kind: str
    ranks: tuple[int, ...]
    step: int
    factor: float = 1.0
    # run-time state beside the spec: whether the nan hook poisons this forward
    _armed: bool = field(default=False, init=False, compare=False, repr=False)

    @property
    def rank(self) -> int:
        """The highest rank named (pre-flight checks that it exists)."""
        return max(self.ranks)

    def fires(self, rank: int, step: int) -> bool:
        # only in the first round: a job restarted by --max-restarts should recover
        if rank not in self.ranks or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
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
        if self.kind in ("kill", "raise", "hang", "stop"):
            self._announce(rank, step)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        if self.kind == "raise":
            raise RuntimeError(f"injected fault on rank {rank} at step {step}")
        if self.kind == "hang":
            while True:
                time.sleep(3600)

    def after_compute(self, rank: int, step: int, compute_seconds: float) -> None:
        if self.kind == "slow" and self.fires(rank, step):
            self._announce(rank, step)
            time.sleep(compute_seconds * (self.factor - 1.0))

    def install(self, model: nn.Module) -> None:
        """For ``nan``: a forward hook on ``model``'s first layer that, while armed, makes its
        output NaN (a real fault's path: forward, then backward into the gradients)."""
        if self.kind != "nan":
            return
        first = next(m for m in model.modules() if not any(True for _ in m.children()))

        def poison(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> Any:
            del module, inputs
            if self._armed and isinstance(output, torch.Tensor) and output.is_floating_point():
                return output * float("nan")  # NaN, with a NaN gradient back to the layer
            return None

        first.register_forward_hook(poison)

    def before_forward(self, rank: int, step: int) -> None:
        """Arm the ``nan`` hook for this step's forward on the faulty rank (see install)."""
        self._armed = self.kind == "nan" and self.fires(rank, step)
        if self._armed:
            self._announce(rank, step)

    def after_forward(self) -> None:
        self._armed = False  # evaluation is not poisoned

    def after_backward(self, rank: int, step: int, model: nn.Module) -> None:
        if self.kind == "inf" and self.fires(rank, step):
            for p in model.parameters():
                if p.grad is not None and p.grad.numel():
                    p.grad.view(-1)[0] = float("inf")  # a single element, on this rank only
                    break


def parse_fault(spec: str) -> Fault | None:
    """Parse ``kill:rank=1:step=5``, ``kill:rank=1+2:step=5`` or ``slow:4:rank=3:step=1``;
    empty means none."""
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
    fields: dict[str, tuple[int, ...]] = {}
    for item in rest:
        key, _, value = item.partition("=")
        numbers = value.split("+") if key == "rank" else [value]
        if key not in ("rank", "step") or not all(n.isdigit() for n in numbers):
            raise UsageError(f"--inject-fault {spec!r}: expected rank=R and step=T, got {item!r}")
        fields[key] = tuple(int(n) for n in numbers)
    if "rank" not in fields:
        raise UsageError(f"--inject-fault {spec!r}: name the rank with rank=R")
    step = fields.get("step", (1,))[0]
    if step < 1:  # it used to fire at step 1 without a word
        raise UsageError(f"--inject-fault {spec!r}: steps count from 1, got step={step}")
    return Fault(kind, fields["rank"], step, factor)
