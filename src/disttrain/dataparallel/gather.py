"""ZeRO stage 3's parameter gathering: each layer's full weights exist only while it computes.

The layout (:mod:`sharding`) has one flat group per layer (each top-level child
module with parameters, and the root's own parameters if any); the flat buffer's
storage is freed (``untyped_storage().resize_(0)``, as FSDP does) except while
the layer runs. Around each layer:

- forward pre-hook: gather it (this rank's shard into its chunk, then an
  all-gather), and start the gather of the next layer in forward order on the
  gather thread (prefetch), so that it travels while this one computes;
- forward post-hook: free it; a hook on its output gathers it again when the
  output's gradient arrives (the start of its backward), prefetching the layer
  before it;
- once every parameter of the layer has its gradient accumulated, it is freed.

Autograd's saved tensors are views of the same storage, so refilling it before
the layer's backward makes them valid again. All gathers run on one thread with
its own process group, in the same order on every rank. ``peak_bytes`` is the
most parameter bytes gathered at once (``gathered_peak`` in summary.json).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from disttrain import collectives, timeline
from disttrain.collectives.checks import checks_everywhere
from disttrain.comm.commthread import CommThread
from disttrain.comm.world import group_timeout
from disttrain.dataparallel.sharding import ShardGroup, ShardLayout

__all__ = ["LayerGatherer", "layer_groups", "layer_units"]


def layer_units(model: nn.Module) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    """The gathered units in forward (registration) order: each child with parameters,
    then the root's own parameters (gathered for the whole forward) if it has any."""
    units: list[tuple[nn.Module, list[nn.Parameter]]] = []
    seen: set[int] = set()
    for child in model.children():
        params = [p for p in child.parameters() if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in params)
        if params:
            units.append((child, params))
    own = [p for p in model.parameters() if p.requires_grad and id(p) not in seen]
    if own:
        units.append((model, own))
    return units


def layer_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """The layout's groups for stage 3: one per unit, last layer first (backward's order)."""
    return [params for _, params in reversed(layer_units(model))]


class LayerGatherer:
    """Gathers each layer of ``model`` around its forward and backward; frees it after."""

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
        units = layer_units(model)
        self.modules = [m for m, _ in units]
        self.groups: list[ShardGroup] = [by_first[id(params[0])] for _, params in units]
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        self._group = dist.new_group(ranks, timeout=group_timeout())  # collective
        self._thread: CommThread | None = CommThread("disttrain-gather")
        self._inflight: dict[int, Any] = {}
        self._gathered: set[int] = set()
        self._grads_in = [0] * len(self.groups)
        self._unit_of = {id(p): i for i, g in enumerate(self.groups) for p in g.params}
        self.held = False  # the whole model gathered for evaluation
        self.current_bytes = 0
        self.peak_bytes = 0
        self._handles: list[Any] = []
        for i, module in enumerate(self.modules):
            if module is model:  # the root's own parameters: for the whole forward
                self._handles.append(module.register_forward_pre_hook(self._pre_forward(i)))
                continue
            self._handles.append(module.register_forward_pre_hook(self._pre_forward(i)))
            self._handles.append(module.register_forward_hook(self._post_forward(i)))
        for g in self.groups:
            for p in g.params:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_in))
        for i in range(len(self.groups)):
            self._free(i)

    # --- gathering and freeing ------------------------------------------------------------
    def _nbytes(self, i: int) -> int:
        flat = self.groups[i].flat
        return flat.numel() * flat.element_size()

    def _start(self, i: int) -> None:
        """Allocate layer ``i``'s buffer, put this rank's shard in, queue its all-gather."""
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
        """Layer ``i`` is whole when this returns."""
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

    # --- the hooks ------------------------------------------------------------------------
    def _pre_forward(self, i: int) -> Any:
        def hook(module: nn.Module, args: Any) -> None:
            if self.held:
                return
            self.gather(i)
            self._grads_in[i] = 0
            self._start(i + 1)  # prefetch the next layer in forward order

        return hook

    def _post_forward(self, i: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.held:
                return
            self._free(i)
            outputs = output if isinstance(output, tuple) else (output,)
            for out in outputs:
                if isinstance(out, torch.Tensor) and out.requires_grad:
                    out.register_hook(self._pre_backward(i))
                    break

        return hook

    def _pre_backward(self, i: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            self.gather(i)
            self._grads_in[i] = 0
            self._start(i - 1)  # prefetch the layer before, next in backward

        return hook

    def _grad_in(self, param: torch.Tensor) -> None:
        i = self._unit_of[id(param)]
        self._grads_in[i] += 1
        if self._grads_in[i] == len(self.groups[i].params):
            self._free(i)

    def release(self) -> None:
        """Free every layer (after a step; after evaluation)."""
        self.held = False
        for i in list(self._inflight):
            self.gather(i)
        for i in range(len(self.groups)):
            self._free(i)

    def full_model(self, keep: bool) -> nn.Module | None:
        """Gather every layer (on every rank) and hold them until :meth:`release`; the
        model on the rank that ``keep``s it (rank 0 evaluates it), None elsewhere."""
        for i in range(len(self.groups)):
            self.gather(i)
        self.held = True
        return self.model if keep else None

    def close(self) -> None:
        if self._thread is not None:
            self._thread.close()
            self._thread = None
