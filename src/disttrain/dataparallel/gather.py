"""ZeRO stage 3's parameter gathering: each layer's full weights exist only while it computes.

The layout (:mod:`sharding`) has one flat group per unit (:mod:`gather_units`: each
top-level child's own parameters, the shared ones, the root's own); the flat buffer's
storage is freed (``untyped_storage().resize_(0)``, as FSDP does) except while it is
used. Around each layer:

- forward pre-hook: gather it (this rank's shard into its chunk, then an
  all-gather), and start the gather of the next layer in forward order on the
  gather thread (prefetch), so that it travels while this one computes;
- forward post-hook: free it; a hook on its output tensors (found in whatever
  structure holds them: tuples, dicts, ``ModelOutput``, dataclasses) gathers it
  again when the first of their gradients arrives (the start of its backward),
  prefetching the layer before it;
- once every parameter of the layer has its gradient accumulated, it is freed.

A kept unit (the root's own parameters, parameters shared by several children) is
gathered at the forward of its first user and freed when the step ends.

Autograd's saved tensors are views of the same storage, so refilling it before
the layer's backward makes them valid again. All gathers run on one thread with
its own process group, in the same order on every rank. ``peak_bytes`` is the
most parameter bytes gathered at once (``gathered_peak`` in summary.json).

What could make a step silently wrong is refused instead (:class:`UsageError`):
a layer returning no tensor that requires grad while its parameters do (its
backward could not be gathered), a layer's gradient arriving before its backward
was gathered (its output reached the loss through a tensor it did not return),
and, checked during the first forward, a parameter read while its unit is not
gathered (read outside the forward of every module that holds it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch import nn
from torch.distributed import ProcessGroup
from torch.utils._python_dispatch import TorchDispatchMode

from disttrain import collectives, timeline
from disttrain.collectives.checks import checks_everywhere
from disttrain.comm.commthread import CommThread
from disttrain.comm.errors import UsageError
from disttrain.comm.forming import new_group
from disttrain.comm.world import group_timeout
from disttrain.dataparallel.gather_units import (
    check_units,
    layer_groups,
    layer_units,
    output_tensors,
)
from disttrain.dataparallel.sharding import ShardGroup, ShardLayout
from disttrain.lean import defer_disables

__all__ = ["LayerGatherer", "layer_groups", "layer_units"]


class _ReadGuard(TorchDispatchMode):
    """Refuses any op that reads a sharded parameter whose unit is not gathered.

    Active during the first forward only (an op's dispatch through Python costs a few
    microseconds): a parameter read outside every module that holds it (``F.linear(h,
    self.wte.weight)`` in the root's forward) reads freed storage, or, worse, a buffer
    whose all-gather is still running. The storage identifies the unit: every
    parameter, and every view of one, shares its group's flat storage."""

    def __init__(self, gatherer: LayerGatherer) -> None:
        super().__init__()
        self.gatherer = gatherer

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not self.gatherer.quiet:
            for t in pytree.tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    self.gatherer.check_read(t, func)
        return func(*args, **kwargs)


# TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, whose first call
# imports torch._dynamo: 1.5 s of CPU per rank at stage 3's first forward, though no
# torch.compile can be running before that module is loaded (disttrain/lean.py's reasoning)
defer_disables(_ReadGuard)


def _compiled(model: nn.Module) -> bool:
    """Whether ``torch.compile`` runs some of ``model``'s forward (``--compile`` replaces a
    forward by its compiled form; ``Module.compile()`` sets ``_compiled_call_impl``): the
    read guard stays off, as dynamo never compiles a frame first called under a dispatch
    mode (measured: ``--compile aot_eager`` on stage 3 captured 0 graphs instead of 11)."""
    if torch.compiler.is_compiling():
        return True
    for m in model.modules():
        forward = m.__dict__.get("forward")
        if hasattr(forward, "_torchdynamo_orig_callable"):
            return True
        if getattr(m, "_compiled_call_impl", None) is not None:
            return True
    return False


class LayerGatherer:
    """Gathers each unit of ``model`` around its forward and backward; frees it after."""

    def __init__(
        self,
        model: nn.Module,
        layout: ShardLayout,
        algorithm: collectives.Algorithm,
        group: ProcessGroup | None,
    ) -> None:
        self.model = model
        self.algo = collectives.resolve(algorithm)
        by_first = {id(g.params[0]): g for g in layout.groups}
        self.units = check_units(model)
        self.groups: list[ShardGroup] = [by_first[id(u.params[0])] for u in self.units]
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        self._group = new_group(ranks, timeout=group_timeout())  # collective
        self._thread: CommThread | None = CommThread("disttrain-gather")
        self._inflight: dict[int, Any] = {}
        self._gathered: set[int] = set()
        self._grads_in = [0] * len(self.groups)
        self._regathered = [False] * len(self.groups)  # gathered for this backward
        self._unit_of = {id(p): i for i, g in enumerate(self.groups) for p in g.params}
        # a group's storage object stays the same through every free and refill
        self._unit_of_storage = {
            g.flat.untyped_storage()._cdata: i for i, g in enumerate(self.groups)
        }
        self._names = {id(p): n for n, p in reversed(list(model.named_parameters()))}
        self._module_names = {id(m): n for n, m in model.named_children()}
        self._module_names[id(model)] = f"the root {type(model).__name__}"
        # prefetch follows the layers only: kept units stay gathered once used
        layers = [i for i, u in enumerate(self.units) if not u.kept]
        self._after = dict(itertools.pairwise(layers))
        self._before = {b: a for a, b in itertools.pairwise(layers)}
        self.held = False  # the whole model gathered for evaluation
        self.quiet = False  # our own hooks' ops (the read guard lets them be)
        self._guard: _ReadGuard | None = None
        self._guard_forwards = 1  # forwards still to check with the read guard
        self.current_bytes = 0
        self.peak_bytes = 0
        self._handles: list[Any] = []
        self._hook_modules()
        for g in self.groups:
            for p in g.params:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_in))
        for i in range(len(self.groups)):
            self._free(i)

    def _hook_modules(self) -> None:
        """One pre-hook per module that uses a unit (the kept units it uses, its layer), a
        post-hook per layer; the root's pair also turns the first forward's guard on, off."""
        uses: dict[int, tuple[nn.Module, list[int], list[int]]] = {}
        for i, unit in enumerate(self.units):
            for m in unit.users:
                _, kept, layer = uses.setdefault(id(m), (m, [], []))
                (kept if unit.kept else layer).append(i)
        uses.setdefault(id(self.model), (self.model, [], []))
        for module, kept, layer in uses.values():
            root = module is self.model
            self._handles.append(
                module.register_forward_pre_hook(self._pre_forward(kept, layer, root))
            )
            for i in layer:
                self._handles.append(module.register_forward_hook(self._post_forward(i)))
            if root:
                self._handles.append(
                    module.register_forward_hook(self._guard_off, always_call=True)
                )

    # --- gathering and freeing ------------------------------------------------------------
    def _nbytes(self, i: int) -> int:
        flat = self.groups[i].flat
        return flat.numel() * flat.element_size()

    def _start(self, i: int) -> None:
        """Allocate unit ``i``'s buffer, put this rank's shard in, queue its all-gather."""
        if i in self._gathered or i in self._inflight or not 0 <= i < len(self.groups):
            return
        g = self.groups[i]
        g.flat.untyped_storage().resize_(self._nbytes(i))
        with torch.no_grad():
            g.flat[g.start : g.stop].copy_(g.shard)
        self.current_bytes += self._nbytes(i)
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        flat, comm, algo, checked = g.flat, self._group, self.algo, checks_everywhere()
        if self._thread is None:  # closed (evaluation after the last step): at once
            algo.all_gather(flat, comm, checked)
            self._gathered.add(i)
            return
        # native: started on gloo's own thread; otherwise a blocking loop on the gather thread
        work = None if checked else collectives.start(algo, "all_gather", flat, comm)
        in_order = work is None
        if work is None:
            work = self._thread.submit(lambda: algo.all_gather(flat, comm, checked))
        timeline.track(work, f"all-gather layer {i}", in_order=in_order, bytes=self._nbytes(i))
        self._inflight[i] = work

    def gather(self, i: int) -> None:
        """Unit ``i`` is whole when this returns."""
        self._start(i)
        work = self._inflight.pop(i, None)
        if work is not None:
            with timeline.span("wait gather", layer=i):
                work.wait()
            self._gathered.add(i)

    def _free(self, i: int) -> None:
        if self.held or i in self._inflight:
            return
        if i in self._gathered or self.groups[i].flat.untyped_storage().nbytes():
            if i in self._gathered:
                self.current_bytes -= self._nbytes(i)
            self._gathered.discard(i)
            self.groups[i].flat.untyped_storage().resize_(0)

    @contextmanager
    def _own_ops(self) -> Iterator[None]:
        """Our hooks' copies and collectives touch buffers not yet gathered: not a misuse."""
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False

    # --- the hooks ------------------------------------------------------------------------
    def _pre_forward(self, kept: list[int], layer: list[int], root: bool) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if self.held:
                return
            if root and self._guard_forwards > 0 and self._guard is None:
                self._guard_forwards -= 1
                if not _compiled(self.model):
                    self._guard = _ReadGuard(self)
                    self._guard.__enter__()  # left by _guard_off, which runs even on errors
            with self._own_ops():
                for i in kept:
                    self.gather(i)
                for i in layer:
                    self.gather(i)
                    self._grads_in[i], self._regathered[i] = 0, False
                    self._start(self._after.get(i, -1))  # prefetch the next layer

        return hook

    def _guard_off(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._guard is not None:
            guard, self._guard = self._guard, None
            guard.__exit__(None, None, None)

    def _post_forward(self, i: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.held:
                return
            with self._own_ops():
                self._free(i)
            tensors = [t for t in output_tensors(output) if t.requires_grad]
            if tensors:  # the first gradient of any of them starts this layer's backward
                torch.autograd.graph.register_multi_grad_hook(
                    tensors, self._pre_backward(i), mode="any"
                )
            elif torch.is_grad_enabled():
                raise UsageError(
                    f"ZeRO stage 3: {self.units[i].name} ({type(module).__name__}) returned "
                    f"no tensor that requires grad ({type(output).__name__}), so its "
                    "parameters could not be gathered for its backward: return its tensors "
                    "in tuples, lists, dicts, dataclasses or ModelOutputs, or freeze its "
                    "parameters (requires_grad_(False))"
                )

        return hook

    def _pre_backward(self, i: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            self.gather(i)
            self._grads_in[i], self._regathered[i] = 0, True
            self._start(self._before.get(i, -1))  # prefetch the layer before, next in backward

        return hook

    def _grad_in(self, param: torch.Tensor) -> None:
        i = self._unit_of[id(param)]
        if self.held or self.units[i].kept:  # kept units: freed when the step ends
            return
        if not self._regathered[i]:
            raise UsageError(
                f"ZeRO stage 3: the gradient of {self._names.get(id(param), '?')} came "
                f"before {self.units[i].name} was gathered for its backward: its output "
                "reached the loss through a tensor it did not return (kept in an object, an "
                "attribute or an input changed in place); return every such tensor"
            )
        self._grads_in[i] += 1
        if self._grads_in[i] == len(self.groups[i].params):
            self._free(i)

    def check_read(self, t: torch.Tensor, func: Any) -> None:
        """The read guard's test of one op's tensor argument (a parameter or a view of one)."""
        try:
            i = self._unit_of_storage.get(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):  # no storage (sparse, meta, ...)
            return
        if i is None or i in self._gathered:
            return
        group, at = self.groups[i], t.storage_offset()
        name = next(
            (self._names.get(id(p), "?") for p, o in group.offsets() if o <= at < o + p.numel()),
            "?",
        )
        holders = " or ".join(self._module_names.get(id(m), "?") for m in self.units[i].users)
        raise UsageError(
            f"ZeRO stage 3: {name} is read ({func}) outside the forward of {holders}, which "
            "holds it: its parameters are gathered only during that forward; call that "
            "module (or read it inside its forward) instead"
        )

    def release(self) -> None:
        """Free every unit (after a step; after evaluation)."""
        self.held = False
        for i in list(self._inflight):
            self.gather(i)
        for i in range(len(self.groups)):
            self._free(i)

    def full_model(self, keep: bool) -> nn.Module | None:
        """Gather every unit (on every rank) and hold them until :meth:`release`; the
        model on the rank that ``keep``s it (rank 0 evaluates it), None elsewhere."""
        for i in range(len(self.groups)):
            self.gather(i)
        self.held = True
        return self.model if keep else None

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None
