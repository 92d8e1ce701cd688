"""``dt.distribute(model, optimizer, strategy=..., **settings)``: every strategy in a script.

    run = dt.distribute(model, optimizer, strategy="diloco", sync_every=50)
    if run.serves:                        # parameter-server processes
        run.serve(); return
    for epoch in range(run.epoch, epochs):
        for batch in run.loader(dataset, batch_size=64, shuffle=True, epoch=epoch):
            loss = run.step(batch, loss_fn)
    model = run.finish()                  # the whole trained model on rank 0, None elsewhere

``run.step`` is :class:`~disttrain.train.step.StepRunner`'s step, the one ``disttrain
train`` runs: zero_grad, forward under the precision's autocast, backward (fp16: the
loss scaled), the finite check, the strategy's communication, the agreed fp16 skip,
the optimizer step and the strategy's after-step (local SGD's average), in that order.
The data-parallel family also lets a script keep its own forward and
``optimizer.step()``: ``run.backward(loss)`` (the strategy's hooks run from the
optimizer's step pre- and post-hooks).
"""

from __future__ import annotations

import atexit
import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import IterableDataset

from disttrain import batch as batches
from disttrain import collectives, strategies
from disttrain.api.loader import Position, agreed, rank_loader_for
from disttrain.api.settings import run_config
from disttrain.comm import world as world_mod
from disttrain.comm.errors import UsageError
from disttrain.dataparallel.broadcast import broadcast_tensors
from disttrain.dataparallel.states import allgather_states
from disttrain.strategies.capabilities import Reshards, before_step, data_shard
from disttrain.train.faults import check_gradients, parse_fault
from disttrain.train.metrics import Timers
from disttrain.train.optimizers import make_optimizer
from disttrain.train.resume import apply_state
from disttrain.train.saver import rank_state
from disttrain.train.step import StepRunner

__all__ = ["DistributedRun", "distribute"]

#: forward(model, batch) -> the loss: a script's own way from a batch to its loss
Forward = Callable[[nn.Module, Any], torch.Tensor]


def distribute(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    strategy: str = "allreduce",
    *,
    forward: Forward | None = None,
    **settings: Any,
) -> DistributedRun:
    """``model`` and ``optimizer`` trained by ``strategy`` over the job's processes.

    ``settings`` are the strategy's own under their flag names with underscores
    (``zero_stage=3``); one it does not read is refused, as on the command line.
    ``optimizer=None``: the trainer's default (``--optimizer``, ``lr``, or the
    strategy's own default). The process group is the launcher's (``torchrun``,
    ``disttrain run``, Ray, Slurm), or one process alone."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"dt.distribute: model must be an nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(
            f"dt.distribute: optimizer must be a torch.optim.Optimizer (or None), "
            f"got {type(optimizer).__name__}"
        )
    if not isinstance(strategy, str):
        raise UsageError(f"dt.distribute: strategy must be a name, got {type(strategy).__name__}")
    size = dist.get_world_size() if dist.is_initialized() else _env_size()
    cfg = run_config(strategy, settings, optimizer is not None, size)
    # pre-flight's own check (the batch splits, stages and mesh fit the model): every rank
    # checks alike, so every rank refuses or none does
    strategies.get(cfg.train.strategy).settings.validate_config(cfg, model)
    return DistributedRun(cfg, model, optimizer, forward)


def _env_size() -> int:
    import os

    return int(os.environ.get("WORLD_SIZE", "1"))


def _rebound(optimizer: torch.optim.Optimizer, params: list[nn.Parameter]) -> Any:
    """``optimizer``'s class and settings over ``params`` (a model-parallel rank's part)."""
    if len(optimizer.param_groups) != 1:
        raise UsageError(
            "dt.distribute: this strategy trains a part of the model on each rank, so the "
            f"optimizer is built again over that part; it has {len(optimizer.param_groups)} "
            "parameter groups: pass one (or optimizer=None)"
        )
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    return type(optimizer)(params, **group)


_EXIT_REGISTERED = [False]


def _leave_at_exit(run: DistributedRun) -> None:
    """At the script's exit, the run lets go of its strategy (whose sub-groups would
    otherwise outlive ``destroy_process_group``: gloo's threads then die in the
    interpreter's teardown, SIGABRT, "terminate called without an active exception"),
    then the process group is left (``dt.shutdown``; a group the script formed itself is
    left to it). Held weakly: a script may build many runs."""
    ref = weakref.ref(run)

    def release() -> None:
        alive = ref()
        if alive is not None:
            alive.release()

    world_mod.at_shutdown(release)
    if not _EXIT_REGISTERED[0]:
        atexit.register(world_mod.shutdown)
        _EXIT_REGISTERED[0] = True


class DistributedRun:
    """One process's part of a script's run (built by :func:`distribute`)."""

    def __init__(
        self,
        cfg: Any,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        forward: Forward | None,
    ) -> None:
        tc = cfg.train
        self.cfg, self.tc = cfg, tc
        threads = tc.threads if "threads" in cfg.given else None  # else the script's own
        self.world = world_mod.init(
            device=tc.device, timeout=tc.timeout, threads=threads, backend=tc.backend
        )
        self.kind = strategies.get(tc.strategy)
        collectives.check_collectives(tc.check_collectives)  # as the trainer does
        if self.world.world_size > 1:  # every rank starts from rank 0's model, as DDP does
            broadcast_tensors(list(model.state_dict().values()), 0, None)
        self._loss_of: batches.LossFn = batches.loss_for({}, None)
        self.strategy = self.kind.build(cfg, self.world, self._loss)
        self._forward = forward
        if forward is not None:
            self.strategy.model_call = forward
        self.model = self.strategy.prepare_model(model, None).to(self.world.device)
        self.user_model = model
        self.optimizer = self._optimizer(optimizer)
        self.strategy.setup(self.model, self.optimizer)
        self.roles = self.strategy.roles
        self.position = Position()
        self.steps = 0
        self._hooks: list[Any] = []
        self._served: dict[str, Any] | None = None  # a server's figures, once it has served
        self._kept: tuple[Any, Any] | None = None  # a loader with persistent workers
        self.runner: StepRunner | None = None
        _leave_at_exit(self)
        if self.roles.is_worker:
            self.runner = StepRunner(
                self.strategy,
                self.optimizer,
                tc,
                Timers(),
                parse_fault(tc.inject_fault),
                self.world.rank,
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

    @property
    def epoch(self) -> int:
        """The epoch to go on with: 0, or a loaded state's (``for e in range(run.epoch, E)``)."""
        return self.position.epoch

    # --- data ---------------------------------------------------------------------------
    def loader(
        self,
        dataset: Any,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        epoch: int = 0,
        **dataloader_kwargs: Any,
    ) -> Any:
        """torch's DataLoader of this rank's share of each global batch of ``batch_size``
        (default: the run's ``batch_size``); every DataLoader keyword passes through.

        On a process that serves (a parameter server) it serves until the workers are
        done and yields nothing, so that one loop is every process's script."""
        if self.serves:
            self._serve_once()
            return []
        rank, shards = data_shard(self.strategy)
        skip = self.position.start(dataset, epoch)
        b = batch_size if batch_size is not None else self.tc.batch_size
        key = (id(dataset), b, shuffle, sorted(dataloader_kwargs.items(), key=str))
        if self._kept is not None and self._kept[0] == key:  # persistent workers stay up
            self._kept[1].batch_sampler.set_epoch(epoch, skip)
            return self._kept[1]
        loader = rank_loader_for(
            dataset, b, rank, shards, self.tc.seed, epoch, skip,
            shuffle=shuffle, **dataloader_kwargs,
        )  # fmt: skip
        if isinstance(dataset, IterableDataset):  # its ranks agree when the stream ends
            return agreed(loader, self.world.rank, self.roles.worker_group)
        if dataloader_kwargs.get("persistent_workers"):  # the next epoch's reuses it
            self._kept = (key, loader)
        return loader

    # --- the step -----------------------------------------------------------------------
    def _loss(self, output: Any, target: Any) -> torch.Tensor:
        return batches.checked_loss(self._loss_of(output, target))

    def _runner(self) -> StepRunner:
        if self.runner is None:
            raise UsageError("a parameter server does not train: if run.serves: run.serve()")
        return self.runner

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
        loss, _ = runner.run(self.steps, x, y)
        self.position.batches += 1
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
            self.position.batches += 1
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
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self.runner = None
        self.strategy = None  # type: ignore[assignment]
        gc.collect()  # the strategy's cycles hold its sub-groups

    def state_dict(self) -> dict[str, Any]:
        """Every worker's state (model, optimizer, strategy, loss scale), the step and the
        data's position, on every worker (a collective: every worker calls it)."""
        runner = self._runner()
        mine = rank_state(self.strategy, self.optimizer, runner)
        parts = allgather_states(mine, self.roles.worker_group)
        return {
            "format": "disttrain.run/1",
            "strategy": self.kind.name,
            "steps": self.steps,
            "position": self.position.state_dict(),
            "ranks": parts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (:meth:`state_dict`'s, saved by any worker count the strategy
        can reshard from); the next ``run.loader`` of its epoch continues it."""
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
        self.position.load_state_dict(state["position"])
