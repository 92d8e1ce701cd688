"""The engine every run trains through: a strategy over a model and its optimizer, and the step.

``disttrain train``'s loop (train/trainer.py) and a script's ``dt.distribute`` run
(api/run.py, which adds the data) are both an :class:`Engine`: the same object builds
the strategy, prepares the model and the optimizer, and runs each step through
:class:`~disttrain.train.step.StepRunner`, the one implementation of the step's order
(zero_grad, forward under autocast, backward, fp16's unscale and agreed skip, the finite
check, the strategy's communication, the optimizer step, the strategy's after-step).

    engine.step(batch, loss_fn)      # one step; its loss
    engine.backward(loss)            # or: a script's own forward and optimizer.step()
    engine.finish()                  # the whole trained model on rank 0
    engine.state_dict() / load_state_dict(state)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from disttrain import batch as batches
from disttrain import collectives, strategies
from disttrain.comm import world as world_mod
from disttrain.comm.errors import UsageError
from disttrain.dataparallel.broadcast import broadcast_tensors
from disttrain.dataparallel.states import allgather_states
from disttrain.strategies.capabilities import Reshards, before_step
from disttrain.train.compiled import compile_forward
from disttrain.train.faults import Fault, check_gradients, parse_fault
from disttrain.train.metrics import Timers
from disttrain.train.optimizers import make_optimizer
from disttrain.train.resume import apply_state
from disttrain.train.saver import rank_state
from disttrain.train.step import StepRunner

__all__ = ["Engine", "Forward", "Given"]

#: forward(model, batch) -> the loss: a script's own way from a batch to its loss
Forward = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class Given:
    """What ``disttrain train`` hands its engine beyond a script's model and optimizer."""

    #: the workload's loss (the trainer's batches are (inputs, target) pairs)
    loss: batches.LossFn
    #: a batch's inputs, for the strategies that measure the model (``--balance time``)
    sample: Any
    #: the fault to inject (``--inject-fault``); a joiner injects none
    fault: Fault | None


class Engine:
    """One process's part of a run: the strategy over ``model`` and ``optimizer``.

    ``given`` is the command line's (:class:`Given`); without it (a script's run) rank 0's
    model is broadcast first, as DDP does, and ``--inject-fault`` is the settings'."""

    def __init__(
        self,
        cfg: Any,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        forward: Forward | None = None,
        given: Given | None = None,
    ) -> None:
        tc = cfg.train
        self.cfg, self.tc = cfg, tc
        # the trainer formed its world already; a script keeps its own thread count unless set
        threads = tc.threads if "threads" in cfg.given else None
        self.world = world_mod.init(
            device=tc.device, timeout=tc.timeout, threads=threads, backend=tc.backend
        )
        self.kind = strategies.get(tc.strategy)
        collectives.check_collectives(tc.check_collectives)
        if given is None and self.world.world_size > 1:  # every rank starts from rank 0's
            broadcast_tensors(list(model.state_dict().values()), 0, None)
        self._loss_of: batches.LossFn = given.loss if given else batches.loss_for({}, None)
        self.strategy = self.kind.build(cfg, self.world, self._loss)
        self._forward = forward
        if forward is not None:
            self.strategy.model_call = forward
        sample = given.sample if given else None
        self.model = self.strategy.prepare_model(model, sample).to(self.world.device)
        compile_forward(self.model, tc.compile)  # --compile (none: eager)
        self.user_model = model
        self.optimizer = self._optimizer(optimizer)
        self.strategy.setup(self.model, self.optimizer)
        self.roles = self.strategy.roles
        #: the steps run so far (a resume's, a regroup's: set by who goes on from there)
        self.steps = 0
        #: whether the last step was skipped (fp16: an overflow on some rank)
        self.skipped = False
        self._hooks: list[Any] = []
        self._served: dict[str, Any] | None = None  # a server's figures, once it has served
        self.runner: StepRunner | None = None
        if self.roles.is_worker:
            fault = given.fault if given else parse_fault(tc.inject_fault)
            self.runner = StepRunner(
                self.strategy, self.optimizer, tc, Timers(), fault, self.world.rank
            )

    def _optimizer(self, optimizer: torch.optim.Optimizer | None) -> torch.optim.Optimizer:
        """The user's optimizer (built again over this rank's part where the strategy keeps
        one), or the trainer's default when none was given."""
        params = list(self.model.parameters())
        if optimizer is None:
            return make_optimizer(params, self.tc)
        owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if owned == {id(p) for p in params}:
            return optimizer
        return _rebound(optimizer, params)

    # --- who this process is ------------------------------------------------------------
    @property
    def serves(self) -> bool:
        """True on a process that does not train (a parameter server): call :meth:`serve`."""
        return not self.roles.is_worker

    def serve(self) -> dict[str, Any]:
        """Serve until the workers are done (parameter servers); the server's figures."""
        if not self.serves:
            raise UsageError("run.serve(): this process trains; call it only where run.serves")
        return self._serve_once()

    def _serve_once(self) -> dict[str, Any]:
        if self._served is None:
            self._served = self.roles.serve()
        return self._served

    # --- the step -----------------------------------------------------------------------
    def _loss(self, output: Any, target: Any) -> torch.Tensor:
        return batches.checked_loss(self._loss_of(output, target))

    def _runner(self) -> StepRunner:
        if self.runner is None:
            raise UsageError("a parameter server does not train: if run.serves: run.serve()")
        return self.runner

    def _stepped(self) -> None:
        """A step is done (a script's run counts its data's position here)."""

    def step(self, batch: Any, loss_fn: batches.LossFn | None = None) -> float:
        """One training step on this rank's ``batch``; the loss (rank 0's shard's mean)."""
        runner = self._runner()
        if self._hooks:
            raise UsageError("run.step after run.backward: use one of the two in a run")
        batch = batches.to_device(batch, self.world.device)
        if self._forward is not None:
            x, y = batch, batch
            self._loss_of = lambda out, _: out
        else:
            x, y = batches.inputs_and_target(batch)
            self._loss_of = batches.loss_for(batch, loss_fn)
        self.steps += 1
        loss, self.skipped = runner.run(self.steps, x, y)
        self._stepped()
        return loss

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()`` for a script that keeps its own forward and ``optimizer.step()``
        (the data-parallel family): the strategy communicates in the optimizer's step."""
        runner = self._runner()
        if not self._hooks:
            self._hook_optimizer(runner)
        batches.checked_loss(loss).backward()
        if runner.check_after_backward:
            check_gradients(self.strategy.model, self.world.rank, self.steps + 1)

    def _hook_optimizer(self, runner: StepRunner) -> None:
        if self.model is not self.user_model or runner.scaler is not None:
            why = "fp16's agreed skip" if runner.scaler else f"--strategy {self.kind.name}"
            raise UsageError(
                f"run.backward: {why} runs forward and the optimizer step itself: call "
                "run.step(batch, loss_fn) instead"
            )

        def pre(*_: Any) -> None:
            self.strategy.after_backward()

        def post(*_: Any) -> None:
            self.steps += 1
            self._stepped()
            self.strategy.after_step(self.steps)
            before_step(self.strategy, self.steps + 1)

        before_step(self.strategy, self.steps + 1)
        self._hooks = [
            self.optimizer.register_step_pre_hook(pre),
            self.optimizer.register_step_post_hook(post),
        ]

    # --- the end and the state ----------------------------------------------------------
    def finish(self) -> nn.Module | None:
        """Training is over: the whole trained model on rank 0, None elsewhere (every rank
        calls it; a server that has not served yet serves first)."""
        if self.serves:
            self._serve_once()
            return None
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self.strategy.finish()
        return self.strategy.eval_model()

    def release(self) -> None:
        """Let go of the strategy, its groups and hooks (``dt.shutdown`` calls it; the run
        cannot step afterwards)."""
        import gc

        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self.runner = None
        self.strategy = None  # type: ignore[assignment]
        gc.collect()  # the strategy's cycles hold its sub-groups

    def state_dict(self) -> dict[str, Any]:
        """Every worker's state (model, optimizer, strategy, loss scale) and the step, on
        every worker (a collective: every worker calls it)."""
        runner = self._runner()
        mine = rank_state(self.strategy, self.optimizer, runner)
        parts = allgather_states(mine, self.roles.worker_group)
        return {
            "format": "disttrain.run/1",
            "strategy": self.kind.name,
            "steps": self.steps,
            "ranks": parts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (:meth:`state_dict`'s, saved by any worker count the strategy
        can reshard from)."""
        runner = self._runner()
        if state.get("format") != "disttrain.run/1" or state.get("strategy") != self.kind.name:
            raise UsageError(
                f"run.load_state_dict: not a state of a --strategy {self.kind.name} run"
            )
        parts = state["ranks"]
        n = dist.get_world_size(self.roles.worker_group) if dist.is_initialized() else 1
        rank = dist.get_rank(self.roles.worker_group) if dist.is_initialized() else 0
        if len(parts) == n:
            mine = parts[rank]
        elif issubclass(cls := type(self.strategy), Reshards):
            mine = cls.reshard(lambda j: parts[j], len(parts), rank, n)
        else:
            raise UsageError(
                f"run.load_state_dict: the state is of {len(parts)} workers, this run has {n}; "
                f"--strategy {self.kind.name} cannot change its layout"
            )
        apply_state(mine, self.strategy, self.optimizer, runner)
        self.steps = int(state["steps"])


def _rebound(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> Any:
    """``optimizer``'s class and settings over ``params`` (a model-parallel rank's part)."""
    if len(optimizer.param_groups) != 1:
        raise UsageError(
            "dt.distribute: this strategy trains a part of the model on each rank, so the "
            f"optimizer is built again over that part; it has {len(optimizer.param_groups)} "
            "parameter groups: pass one (or optimizer=None)"
        )
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    # a group also holds what the class's own __init__ sets and does not take (AdamW's
    # decoupled_weight_decay, passed on to Adam): built from what it takes, then given the
    # whole group as the user's optimizer had it
    takes = inspect.signature(type(optimizer).__init__).parameters
    any_key = any(p.kind is p.VAR_KEYWORD for p in takes.values())
    given = {k: v for k, v in group.items() if any_key or k in takes}
    rebuilt = type(optimizer)(params, **given)
    rebuilt.param_groups[0].update(group)
    return rebuilt
