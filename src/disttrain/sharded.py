"""ZeRO from a plain script: ``dt.ShardedOptimizer`` and ``dt.shard_model``.

    import disttrain as dt
    dt.init()                                        # torchrun's environment
    model = dt.shard_model(model)                    # stage 3, as FSDP2's fully_shard
    opt = dt.ShardedOptimizer(model.parameters(), torch.optim.Adam, lr=1e-3)
    for x, y in batches:                             # this rank's slice of each batch
        opt.zero_grad()
        loss_fn(model(x), y).backward()              # gradients reduce-scattered meanwhile
        opt.step()                                   # this rank's shard steps
    state = model.full_state_dict()                  # rank 0: the plain model's state_dict
    optim = opt.full_state_dict()                    # rank 0: Adam(plain.parameters())'s

Without ``shard_model``, ``ShardedOptimizer(model.parameters(), torch.optim.Adam, ...)``
is ZeRO stage 2 (``stage=1``: the full gradients stay, as torch's
``ZeroRedundancyOptimizer`` under DDP): the optimizer state and the averaged
gradients are cut into one shard per rank, ``step()`` updates this rank's shard,
then all-gathers the parameters. Unlike ``ZeroRedundancyOptimizer`` it averages the
gradients itself (do not wrap the model in DDP); both broadcast rank 0's
parameters when made, so every rank starts from the same model.

All the mechanics are the zero strategy's (:class:`~disttrain.dataparallel.zero.ZeroEngine`:
shard layout, reducer, per-layer gathering); this module only wires them to a
torch optimizer and a module. The optimizer must be elementwise (SGD, momentum,
Adam, AdamW: each element's update reads only its own gradient and state) and have
one parameter group.

A sharded model's parameters exist only while a layer computes: between steps
their storage is freed, so reading them (``print(model.weight)``, ``model.state_dict()``)
is refused or invalid; ``full_state_dict()`` gathers them (a collective: every rank
calls it). Each top-level child module with parameters is one gathered unit, and the
next one in registration order is prefetched, so register children in forward order.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.comm.errors import UsageError
from disttrain.dataparallel.broadcast import broadcast_tensors
from disttrain.dataparallel.fusion import MB
from disttrain.dataparallel.wrapper import OptimizerWrapper
from disttrain.dataparallel.zero import ZeroEngine

__all__ = ["ShardedModule", "ShardedOptimizer", "shard_model"]

#: id of each sharded model's parameter -> (the parameter, weakly; its engine), found again
#: by ShardedOptimizer. Not a WeakKeyDictionary: that compares keys with ``==``, which
#: reads a parameter whose storage is freed.
_ENGINES: dict[int, tuple[weakref.ref[nn.Parameter], ZeroEngine]] = {}
_CLASSES: dict[type[nn.Module], type[nn.Module]] = {}


def _need_init(what: str) -> None:
    if not dist.is_initialized():
        raise UsageError(f"call disttrain.init() before {what}")


def _forget(key: int) -> Callable[[weakref.ref[nn.Parameter]], None]:
    """The callback that drops a parameter's entry when it is garbage collected."""

    def drop(_: weakref.ref[nn.Parameter]) -> None:
        _ENGINES.pop(key, None)

    return drop


def _engine_of(p: nn.Parameter) -> ZeroEngine | None:
    entry = _ENGINES.get(id(p))
    return entry[1] if entry is not None and entry[0]() is p else None


class ShardedModule(nn.Module):
    """The class ``shard_model`` gives a module (its own class stays a base, as FSDP2 does)."""

    _zero_engine: ZeroEngine

    def full_state_dict(self, to: int = 0) -> dict[str, torch.Tensor]:
        """The unsharded model's ``state_dict`` on rank ``to`` ({} elsewhere); collective."""
        engine = self._zero_engine
        keep = dist.get_rank(engine.group) == to
        engine.full_model(self, keep)  # every layer gathered on every rank
        try:
            if not keep:
                return {}
            whole = nn.Module.state_dict(self)
            return {k: v.detach().clone() for k, v in whole.items()}
        finally:
            engine.release()

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        raise UsageError(
            "a sharded model's parameters exist only as shards between steps: call "
            "model.full_state_dict() on every rank (rank 0 gets the whole state_dict)"
        )


def shard_model(
    model: nn.Module,
    *,
    algorithm: str = "native",
    overlap: bool = True,
    process_group: ProcessGroup | None = None,
) -> nn.Module:
    """Shard ``model``'s parameters over the ranks (ZeRO stage 3); returns the same module.

    Rank 0's parameters and buffers are broadcast first. Each top-level child with
    parameters is then one flat group cut into one chunk per rank; the whole layer
    is all-gathered before its forward and again before its backward, and freed
    after; its gradient is reduce-scattered (``overlap``: during backward). Train it
    with :class:`ShardedOptimizer` over ``model.parameters()``.
    """
    _need_init("dt.shard_model(...)")
    if isinstance(model, ShardedModule):
        raise UsageError("this model is already sharded (dt.shard_model was called on it)")
    if dist.get_world_size(process_group) > 1:
        broadcast_tensors(list(model.state_dict().values()), 0, process_group)
    engine = ZeroEngine.build(model, [], 3, algorithm, overlap, process_group, 0)
    for p in engine.params():
        _ENGINES[id(p)] = (weakref.ref(p, _forget(id(p))), engine)
    cls = type(model)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Sharded{cls.__name__}", (ShardedModule, cls), {})
    model.__class__ = _CLASSES[cls]
    object.__setattr__(model, "_zero_engine", engine)  # an attribute, not a submodule
    return model


class ShardedOptimizer(OptimizerWrapper):
    """``optimizer_class`` over this rank's shard of ``params``: ZeRO stage 1, 2 or 3.

    Stage 3 when ``params`` are a :func:`shard_model` model's; otherwise ``stage``
    (default 2) with ``params`` packed into fusion buckets of ``fusion_mb``.
    ``defaults`` go to ``optimizer_class`` (``lr=...``).
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        optimizer_class: Callable[..., torch.optim.Optimizer],
        *,
        stage: int | None = None,
        algorithm: str = "native",
        fusion_mb: float = 25.0,
        overlap: bool = True,
        process_group: ProcessGroup | None = None,
        **defaults: Any,
    ) -> None:
        # Optimizer.__init__ is not called: the state belongs to the wrapped optimizer.
        _need_init("dt.ShardedOptimizer(...)")
        self.params = list(params)
        if not self.params or not all(isinstance(p, nn.Parameter) for p in self.params):
            raise UsageError(
                "ShardedOptimizer takes the parameters themselves (one parameter group), "
                "e.g. model.parameters()"
            )
        # frozen parameters get no gradient, hence no shard and no state (as torch's)
        trainable = [p for p in self.params if p.requires_grad]
        engines = {id(e): e for p in trainable if (e := _engine_of(p)) is not None}
        if engines:
            engine = next(iter(engines.values()))
            if len(engines) > 1 or {id(p) for p in trainable} != {id(p) for p in engine.params()}:
                raise UsageError(
                    "ShardedOptimizer over a sharded model takes all of its parameters and "
                    "no others: pass model.parameters()"
                )
            if stage not in (None, 3):
                raise UsageError(f"the model is sharded (stage 3): stage={stage} cannot apply")
        else:
            stage = 2 if stage is None else stage
            if stage not in (1, 2):
                raise UsageError(
                    f"stage={stage}: ShardedOptimizer shards stages 1 and 2 itself; for stage 3 "
                    "call dt.shard_model(model) first"
                )
            if dist.get_world_size(process_group) > 1:
                broadcast_tensors([p.detach() for p in self.params], 0, process_group)
            engine = ZeroEngine.build(
                None, trainable, stage, algorithm, overlap, process_group, int(fusion_mb * MB)
            )
        self.engine = engine
        self.optimizer = optimizer_class(engine.layout.shards, **defaults)
        if len(self.optimizer.param_groups) != 1:
            raise UsageError("ShardedOptimizer supports one parameter group")

    # --- the wrapped optimizer's own state (param_groups, state, ...): OptimizerWrapper
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise UsageError("ShardedOptimizer supports one parameter group")

    def __repr__(self) -> str:
        return f"ShardedOptimizer({self.optimizer!r}, stage={self.engine.stage})"

    # --- the step -------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the shards' and the parameters' gradients (and free the layers a
        ``full_state_dict`` or evaluation left gathered)."""
        self.optimizer.zero_grad(set_to_none=set_to_none)
        self.engine.begin_step()

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients; the next one outside reduces."""
        with self.engine.no_sync():
            yield

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Wait for the gradients' reduction, step this rank's shard, all-gather (stages 1, 2)."""
        if closure is not None:
            raise UsageError("ShardedOptimizer.step takes no closure")
        self.engine.synchronize()
        out = self.optimizer.step()
        self.engine.finish_step()
        return out

    def close(self) -> None:
        """Remove the gradient hooks and stop the communication threads."""
        self.engine.close()

    # --- the whole state ---------------------------------------------------------------
    def full_state_dict(self, to: int = 0) -> dict[str, Any]:
        """The state_dict of ``optimizer_class(params)`` unsharded, on rank ``to`` ({}
        elsewhere): loadable into the plain optimizer over the plain model's parameters
        (index i = the i-th of ``params``). Collective: every rank calls it."""
        engine = self.engine
        algo = collectives.get(engine.algorithm)
        keep = dist.get_rank(engine.group) == to
        index = {id(p): i for i, p in enumerate(self.params)}
        state: dict[int, dict[str, Any]] = {}
        for group in engine.layout.groups:
            entry = self.optimizer.state.get(group.shard, {})
            for key in sorted(entry):  # the same keys on every rank: every shard stepped
                value = entry[key]
                if isinstance(value, torch.Tensor) and value.dim() >= 1:
                    full = torch.zeros(group.numel, dtype=value.dtype, device=value.device)
                    full[group.start : group.stop] = value
                    algo.all_gather(full, engine.group)
                    pieces = {id(p): full[o : o + p.numel()].view_as(p) for p, o in group.offsets()}
                else:
                    pieces = {id(p): value for p in group.params}
                for p in group.params:
                    v = pieces[id(p)]
                    v = v.clone() if isinstance(v, torch.Tensor) else v
                    state.setdefault(index[id(p)], {})[key] = v
        if not keep:
            return {}
        groups = [
            {
                **{k: v for k, v in g.items() if k != "params"},
                "params": list(range(len(self.params))),
            }
            for g in self.optimizer.state_dict()["param_groups"]
        ]
        return {"state": dict(sorted(state.items())), "param_groups": groups}
