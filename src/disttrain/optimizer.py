"""Horovod's ``DistributedOptimizer``: wrap the user's optimizer, average gradients, then step.

    opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  algorithm="ring", fusion_mb=25, compression=None)

``compression`` is a cast, spelled as ``disttrain train --compression``: None or
``"none"`` (fp32), ``"fp16"``, ``"bf16"``, or the compressor object itself.

The wrapper registers the data-parallel engine's gradient hooks
(:class:`~disttrain.dataparallel.reducer.Reducer`) on the named parameters, so
buckets go out while backward runs; ``step()`` first waits for them, then calls
the wrapped optimizer. It *is* a ``torch.optim.Optimizer`` (LR schedulers accept
it) whose ``param_groups`` and ``state`` are the wrapped optimizer's own.

Uneven inputs: a rank whose data ends first must not leave the others waiting
in an allreduce. Inside ``with opt.join():`` every ``step()`` first sums a
one-element "still training" flag; a rank that has left the loop keeps joining
the others' allreduces with zero gradients until every rank has left (the idea
of PyTorch's ``Join``). Gradients are then averaged over all ranks, as DDP does,
and at the end every rank takes the parameters and optimizer state of a rank
that trained to the last step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain.comm.errors import UsageError
from disttrain.comm.forming import new_group
from disttrain.comm.world import group_timeout
from disttrain.compression.base import Compressor
from disttrain.dataparallel.broadcast import broadcast_optimizer_state, broadcast_tensors
from disttrain.dataparallel.reducer import Reducer
from disttrain.dataparallel.wrapper import OptimizerWrapper

__all__ = ["DistributedOptimizer"]


class DistributedOptimizer(OptimizerWrapper):
    """``optimizer`` whose ``step()`` applies gradients averaged over every rank."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, nn.Parameter]] | None = None,
        algorithm: str = "native",
        fusion_mb: float = 25.0,
        compression: str | Compressor | None = None,
        overlap: bool = True,
        process_group: ProcessGroup | None = None,
    ) -> None:
        # Optimizer.__init__ is not called: the state belongs to the wrapped optimizer.
        if not dist.is_initialized():
            raise UsageError("call disttrain.init() before DistributedOptimizer(...)")
        self.optimizer = optimizer
        owned = [p for group in optimizer.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            names = [name for name, _ in named]
            if len(set(names)) != len(names):
                raise UsageError("named_parameters has duplicate names")
            known = {id(p) for _, p in named}
            missing = [p for p in owned if id(p) not in known]
            if missing:
                raise UsageError(
                    f"{len(missing)} optimizer parameter(s) are not in named_parameters: "
                    "pass model.named_parameters() of the whole model"
                )
            # registration order of the model, as backward order depends on it
            params = [p for _, p in named if id(p) in {id(q) for q in owned}]
        else:
            params = owned
        self.process_group = process_group
        self.reducer = Reducer(
            params,
            algorithm=algorithm,
            fusion_mb=fusion_mb,
            overlap=overlap,
            group=process_group,
            compression=compression,
        )
        self._joining = False
        # The join flag has a group of its own: on the gradients' group it would queue
        # behind (or ahead of) buckets already launched during backward.
        ranks = dist.get_process_group_ranks(process_group or dist.group.WORLD)
        self._flag_group = new_group(ranks, timeout=group_timeout())

    # --- the wrapped optimizer's own state (param_groups, state, ...): OptimizerWrapper
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise UsageError("add parameter groups before wrapping in DistributedOptimizer")

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r}, algorithm={self.reducer.algorithm!r})"

    # --- communication --------------------------------------------------------------------
    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients; the next one outside communicates."""
        with self.reducer.no_sync():
            yield

    def synchronize(self) -> None:
        """Wait until every gradient holds the average over all ranks."""
        self.reducer.synchronize()

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Average the gradients (waiting only for buckets still in flight), then step."""
        if self._joining:
            self._agree_still_training(True)
        self.synchronize()
        return self.optimizer.step(closure)

    # --- uneven inputs ----------------------------------------------------------------------
    def _agree_still_training(self, me: bool) -> int:
        flag = torch.tensor([1 if me else 0], dtype=torch.int64)
        dist.all_reduce(flag, group=self._flag_group)
        return int(flag)

    @contextmanager
    def join(self) -> Iterator[None]:
        """Wrap the training loop: a rank that runs out of data shadows the others' steps.

        Every rank must enter the block; after its own loop ends, a rank takes
        part (with zero gradients) in the allreduces of ranks still training.
        """
        self._joining = True
        try:
            yield
        finally:
            self._joining = False
        last_joiner = True
        while self._agree_still_training(False):
            last_joiner = False
            for p in self.reducer.params:
                p.grad = None
            self.reducer.synchronize()  # zeros into every bucket, in bucket order
        # Ranks that left early skipped steps: all take the model of a last joiner.
        group = self.process_group
        root = torch.tensor([dist.get_rank(group) if last_joiner else -1])
        dist.all_reduce(root, op=dist.ReduceOp.MAX, group=group)
        broadcast_tensors(self.reducer.params, int(root), group)
        broadcast_optimizer_state(self.optimizer, int(root), group)

    def close(self) -> None:
        """Remove the gradient hooks (the wrapped optimizer stays usable)."""
        self.reducer.close()
