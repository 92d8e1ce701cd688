"""Horovod's ``DistributedOptimizer``: the user's optimizer, with gradients reduced over ranks.

``hvd.DistributedOptimizer(opt, named_parameters=...)`` returns an instance of a class
made on the fly from ``opt``'s own class (``isinstance(opt, torch.optim.SGD)`` still
holds), built from ``opt.param_groups``. A hook after each gradient's accumulation
counts the backward passes (``backward_passes_per_step``); once a parameter's count
is reached its gradient is queued for an allreduce (``hvd.allreduce_async_``, named
after the parameter). ``step()`` first waits for every reduction (``synchronize()``).

Our collectives are matched in call order, not by name (engine.py), so launches go in
one fixed order on every rank: the parameters in reverse registration order (the
order backward usually produces them); a ready gradient waits for those before it.
Parameters a rank did not use are sent as zeros at ``synchronize()``, so every rank
takes part in every reduction (Horovod's rule too).

Tensor fusion: Horovod's engine fuses the gradients that are ready in the same cycle
(1 ms) into one buffer of up to ``HOROVOD_FUSION_THRESHOLD`` bytes. Here consecutive
gradients in the launch order share one flat buffer and one allreduce, cut where the
next one would pass ``HOROVOD_FUSION_THRESHOLD`` (default 25 MiB, DDP's bucket: a
bucket goes out while backward still runs) or has another dtype; the cuts depend on
sizes only, so they are the same on every rank. ``HOROVOD_FUSION_THRESHOLD=0``: one
allreduce per parameter. Explicit ``groups`` are launched as given, without fusion.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from disttrain.horovod import engine
from disttrain.horovod.compression import Compressor, NoneCompressor
from disttrain.horovod.ops import (
    Adasum,
    Average,
    allreduce_async_,
    grouped_allreduce_async_,
    synchronize,
)
from disttrain.horovod.process_sets import ProcessSet, global_process_set

__all__ = ["DistributedOptimizer"]

FUSION_BYTES = 25 << 20  # without HOROVOD_FUSION_THRESHOLD (see the module doc)

_TOO_MANY = (
    "Gradients were computed more than backward_passes_per_step times before call to "
    "step(). Increase backward_passes_per_step to accumulate gradients locally."
)
_RACE = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() "
    "or optimizer.synchronize(). This is prohibited as it can cause a race condition."
)


def _names(param_groups: list[dict[str, Any]], named: Any) -> dict[nn.Parameter, str]:
    """Parameter -> name, with Horovod's checks (no init needed)."""
    owned = [p for group in param_groups for p in group["params"]]
    if named is None:
        return {
            p: f"allreduce.noname.{g}.{i}"
            for g, group in enumerate(param_groups)
            for i, p in enumerate(group["params"])
        }
    named = list(named)
    if any(not isinstance(item, tuple) for item in named):
        raise ValueError(
            "named_parameters should be a sequence of tuples (name, parameter), "
            "usually produced by model.named_parameters()."
        )
    names = [n for n, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            "Parameter names in named_parameters must be unique. Found "
            f"duplicates: {', '.join(duplicates)}"
        )
    known = {id(p) for _, p in named}
    unnamed = [id(p) for p in owned if id(p) not in known]
    if unnamed:
        raise ValueError(
            "named_parameters was specified, but one or more model parameters "
            f"were not named. Python object ids: {', '.join(map(str, unnamed))}"
        )
    return {p: n for n, p in named}


def _units(params: list[nn.Parameter], groups: Any) -> list[list[nn.Parameter]]:
    """The launch units in launch order: one parameter each, or Horovod's ``groups``."""
    if groups is None:
        return [[p] for p in params]
    if isinstance(groups, int) and not isinstance(groups, bool) and groups > 0:
        q, m = divmod(len(params), groups)
        cuts = [i * q + min(i, m) for i in range(groups + 1)]
        return [params[a:b] for a, b in itertools.pairwise(cuts) if b > a]
    if isinstance(groups, list):
        flat = [t for g in groups for t in g]
        if any(not isinstance(t, torch.Tensor) for t in flat):
            raise ValueError("groups must consist of torch.Tensor.")
        if len({id(t) for t in flat}) != len(flat):
            raise ValueError("A parameter can only appear once in groups.")
        order = {id(p): i for i, p in enumerate(params)}
        units = [
            sorted((t for t in g if id(t) in order), key=lambda t: order[id(t)]) for g in groups
        ]
        grouped = {id(t) for t in flat}
        units += [[p] for p in params if id(p) not in grouped]
        units = [u for u in units if u]
        return sorted(units, key=lambda u: order[id(u[0])])
    raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")


class _DistributedOptimizer(torch.optim.Optimizer):
    """The mix-in placed before the user's optimizer class (see the module's docstring)."""

    def __init__(
        self,
        params: Any,
        named_parameters: Any,
        compression: type[Compressor],
        backward_passes_per_step: int,
        op: int,
        gradient_predivide_factor: float,
        groups: Any,
        sparse_as_dense: bool,
        process_set: ProcessSet,
    ) -> None:
        super().__init__(params)  # type: ignore[call-arg]  # the wrapped class's own
        self._parameter_names = _names(self.param_groups, named_parameters)
        self.compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._should_synchronize = True
        self._synchronized = False
        self._handles: dict[torch.Tensor, Any] = {}  # launched or accumulating this step
        # (parameters, handle, compression contexts, their shapes when fused into one)
        self._launched: list[tuple[list[nn.Parameter], int, list[Any], Any]] = []
        self._fusion = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", FUSION_BYTES))
        self._bucket: list[nn.Parameter] = []  # ready, waiting to be fused with the next
        self._ready: set[torch.Tensor] = set()
        self._next_unit = 0
        self._hooks: list[Any] = []
        trained = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        position = {id(p): i for i, p in enumerate(self._parameter_names)}
        order = sorted(trained, key=lambda p: position[id(p)], reverse=True)
        self._units = _units(order, groups)
        self._delay = {p: backward_passes_per_step for p in trained}
        elastic = os.environ.get("HOROVOD_ELASTIC") == "1"
        if process_set.included() and (engine.current_size() > 1 or elastic):
            self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in trained]

    # --- during backward ------------------------------------------------------------------
    def _on_grad(self, p: torch.Tensor) -> None:
        if p in self._handles and self._delay[p] <= 0:
            raise AssertionError(_TOO_MANY)
        self._delay[p] -= 1
        self._handles[p] = None
        if self._delay[p] == 0:
            self._ready.add(p)
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch the units whose gradients are all ready, in the one launch order; single
        parameters go into the fusion bucket, sent once full or once all are ready."""
        while self._next_unit < len(self._units):
            unit = self._units[self._next_unit]
            if not all(p in self._ready for p in unit):
                return
            self._next_unit += 1
            if len(unit) == 1 and self._fusion > 0 and self.op != Adasum:
                self._add_to_bucket(unit[0])
            else:
                self._flush()
                self._launch(unit)
        self._flush()  # the last bucket: nothing more will join it this step

    def _add_to_bucket(self, p: nn.Parameter) -> None:
        bucket = self._bucket
        size = p.numel() * p.element_size()
        if bucket and (
            p.dtype != bucket[0].dtype
            or size + sum(q.numel() * q.element_size() for q in bucket) > self._fusion
        ):
            self._flush()
        self._bucket.append(p)

    def _flush(self) -> None:
        bucket, self._bucket = self._bucket, []
        if bucket:
            self._launch(bucket, fuse=len(bucket) > 1)

    def _launch(self, unit: list[nn.Parameter], fuse: bool = False) -> None:
        """One allreduce for ``unit``: of its one gradient, of its gradients in one flat
        buffer (``fuse``), or grouped (Horovod's ``groups``)."""
        grads, contexts = [], []
        for p in unit:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if p.grad.is_sparse:
                if not self.sparse_as_dense:
                    raise ValueError("sparse gradients: pass sparse_as_dense=True")
                p.grad = p.grad.to_dense()
            compressed, ctx = self.compression.compress(p.grad)
            grads.append(compressed)
            contexts.append(ctx)
        name = self._parameter_names[unit[0]]
        shapes = [g.shape for g in grads] if fuse else None
        if len(unit) == 1 or fuse:
            pre = post = 1.0
            if self.op == Average:  # Horovod's split of the averaging around the sum
                pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
            flat = torch.cat([g.reshape(-1) for g in grads]) if fuse else grads[0]
            handle = allreduce_async_(
                flat,
                name=f"{name}+{len(unit) - 1}" if fuse else name,  # the bucket's first
                op=self.op,
                prescale_factor=pre,
                postscale_factor=post,
                process_set=self.process_set,
            )
        else:
            handle = grouped_allreduce_async_(
                grads, name=name, op=self.op, process_set=self.process_set
            )
        self._launched.append((unit, handle, contexts, shapes))
        for p in unit:
            self._handles[p] = handle

    # --- synchronize and step ---------------------------------------------------------------
    def synchronize(self) -> None:
        """Reduce every gradient (unused ones as zeros) and wait; then gradients hold the result."""
        if not self.process_set.included():
            self._synchronized = True
            return
        if self._hooks:
            self._ready.update(self._delay)  # the rest go now, accumulated or zero
            self._launch_ready()
        for unit, handle, contexts, shapes in self._launched:
            out = synchronize(handle)
            outs = out if isinstance(out, tuple) else (out,)
            if shapes is not None:  # a fused bucket: each gradient's slice of the buffer
                sizes = [s.numel() for s in shapes]
                outs = tuple(o.view(s) for o, s in zip(out.split(sizes), shapes, strict=True))
            for p, o, ctx in zip(unit, outs, contexts, strict=True):
                value = self.compression.decompress(o, ctx)
                assert p.grad is not None
                if shapes is not None and value.dtype == p.grad.dtype:
                    # the gradient becomes its slice of the summed buffer, no copy (as
                    # DDP's gradient_as_bucket_view; Horovod's set_ does the same)
                    offset, shape = value.storage_offset(), value.shape
                    p.grad.set_(value.untyped_storage(), offset, shape, value.stride())
                elif value is not p.grad:
                    p.grad.copy_(value)
        self._reset()
        self._synchronized = True

    def _reset(self) -> None:
        self._handles.clear()
        self._launched.clear()
        self._bucket.clear()
        self._ready.clear()
        self._next_unit = 0
        self._delay = dict.fromkeys(self._delay, self.backward_passes_per_step)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside does not synchronize (after an explicit ``synchronize()``)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() "
                    "context after optimizer.synchronize(). This can cause training "
                    "slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles:
            raise AssertionError(_RACE)
        super().zero_grad(set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        self._delay = dict.fromkeys(self._delay, passes)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._reset()
        self._synchronized = False
        super().load_state_dict(state_dict)


class _DistributedAdasumOptimizer(_DistributedOptimizer):
    """Horovod's ``_DistributedAdasumOptimizer`` (horovod/torch/optimizer.py): Adasum of each
    rank's *update*, not of its gradients. Once a parameter's gradient is ready, the
    wrapped optimizer steps that parameter alone on this rank's gradient; the change it
    made (delta = after - before) is reduced with Adasum, and ``step()`` sets the
    parameter to before + Adasum(deltas). The optimizer's state (momentum, Adam's
    moments) stays each rank's own, as in Horovod. Launches go in the base class's one
    fixed order; ``groups``, ``sparse_as_dense`` and the scale factors do not apply.
    """

    def __init__(
        self,
        params: Any,
        named_parameters: Any,
        compression: type[Compressor],
        backward_passes_per_step: int,
    ) -> None:
        super().__init__(
            params,
            named_parameters,
            compression,
            backward_passes_per_step,
            Adasum,
            1.0,
            None,
            False,
            global_process_set,
        )
        trained = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        for p in trained:  # Horovod starts every gradient at zero
            p.grad = torch.zeros_like(p)
        self._start = {p: torch.zeros_like(p, requires_grad=False) for p in trained}

    def _local_step(self, p: nn.Parameter) -> None:
        """The wrapped optimizer's step on ``p`` alone; ``p`` then holds its change."""
        stashed = [g["params"] for g in self.param_groups]
        for g in self.param_groups:
            g["params"] = [p] if any(q is p for q in g["params"]) else []
        start = self._start[p]
        try:
            with torch.no_grad():
                start.copy_(p)
            super(_DistributedOptimizer, self).step()  # the wrapped class's own step
        finally:
            for g, kept in zip(self.param_groups, stashed, strict=True):
                g["params"] = kept
        with torch.no_grad():
            p.sub_(start)

    def _launch(self, unit: list[nn.Parameter], fuse: bool = False) -> None:
        del fuse  # never: Adasum is not fused (see _launch_ready)
        for p in unit:  # one parameter per unit: groups are not built for Adasum
            self._local_step(p)
            compressed, ctx = self.compression.compress(p.data)
            name = self._parameter_names[p]
            handle = allreduce_async_(compressed, name=name, op=Adasum)
            self._launched.append(([p], handle, [ctx], None))
            self._handles[p] = handle

    def synchronize(self) -> None:
        """Nothing to do: ``step()`` waits for the deltas (Horovod's is a no-op too)."""

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        raise AssertionError(
            "Skipping synchronization is not supported when using Adasum optimizer."
        )
        yield  # a generator, so that the error comes at ``with``, as Horovod's

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        """Step the parameters not launched yet (on whatever gradient they hold), then
        set every parameter to its start plus the Adasum of the ranks' deltas."""
        loss = closure() if closure is not None else None
        self._ready.update(self._delay)
        self._launch_ready()
        for unit, handle, contexts, _ in self._launched:
            delta = self.compression.decompress(synchronize(handle), contexts[0])
            p, start = unit[0], self._start[unit[0]]
            with torch.no_grad():
                start.add_(delta)
                p.copy_(start)
        self._reset()
        return loss


def DistributedOptimizer(  # Horovod's name for a factory
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, nn.Parameter]] | None = None,
    compression: type[Compressor] = NoneCompressor,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """Wrap ``optimizer``: ``step()`` applies gradients reduced (``op``) over the set.

    ``op=hvd.Adasum`` on more than one rank: each rank steps on its own gradients and the
    updates are combined with Adasum (:class:`_DistributedAdasumOptimizer`, as Horovod).
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=2,
        )
        groups = groups if groups is not None else num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    base = optimizer.__class__
    if op == Adasum and engine.current_size() > 1:  # one rank: the plain class, as Horovod
        if process_set is not global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        adasum = type(base.__name__, (_DistributedAdasumOptimizer, base), {"__module__": __name__})
        return adasum(
            optimizer.param_groups, named_parameters, compression, backward_passes_per_step
        )
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": __name__})
    return cls(
        optimizer.param_groups,
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        groups,
        sparse_as_dense,
        process_set,
    )
