"""The backward split in two (zero-bubble pipelines): B, the input gradient, and W, the weights'.

During the forward, :class:`Recorder` keeps where the output of every module
that owns parameters enters the graph (its ``GradientEdge``, a forward hook: not
the output tensor itself, which would keep, e.g., a Linear's pre-activation
alive until W). B (:func:`backward_input`) asks autograd for the gradient of the
stage's input *and* of those outputs, keeping the graph: the engine computes
only what leads to the tensors asked for, so no weight gradient is formed. W
(:func:`backward_weight`) then asks, per recorded output, for its module's
parameters' gradients from the output's gradient: each layer's own backward
node once more, for the weight part only (for ``nn.Linear``: B runs ``grad @
W``, W runs ``grad.T @ x`` and ``grad.sum(0)``, the same kernels the fused
backward runs, so B + W give the fused gradients bit for bit). The gradients
are added into ``.grad`` as autograd's own accumulation does. An ``nn.Linear``
on 2-D fp32 inputs (no autocast) skips the engine in W: its weight gradient is
``grad.T @ x`` and its bias's ``grad.sum(0)``, the very calls autograd's
``AddmmBackward0`` makes for a transposed weight (``mm_mat2_backward``), so the
result is the same bit for bit, without an engine run per layer (measured: W cost
more than the fused backward's weight part, mostly in engine start-ups).

What W needs is only what the parameter-owning layers' own operations saved
(a Linear's input) and the gradients of their outputs: :meth:`Recorder.inside`
tells the runner's saved-tensor hook which tensors those are, and the runner
lets go of every other saved tensor (an activation function's, the loss's) right
after B (ZB-H1's M_W < M_B, Qi et al. 2024, section 3.1).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

__all__ = ["PendingW", "Recorder", "backward_input", "backward_weight"]


@dataclass
class PendingW:
    """What W needs of one micro-batch on one stage: where each layer's output entered the
    graph, its gradient (from B) and its parameters; ``nbytes`` is the gradients' size
    (held until W)."""

    outputs: list[GradientEdge] = field(default_factory=list)
    grads: list[torch.Tensor | None] = field(default_factory=list)
    params: list[list[nn.Parameter]] = field(default_factory=list)
    #: a Linear's 2-D input where W computes ``grad.T @ x`` itself (else None: the engine)
    inputs: list[torch.Tensor | None] = field(default_factory=list)
    nbytes: int = 0


#: per recorded layer: where its output enters the graph, its parameters, a Linear's input
Layers = list[tuple[GradientEdge, list[nn.Parameter], torch.Tensor | None]]


class Recorder:
    """Forward hooks on every parameter-owning module of ``module`` that record outputs.

    ``inside()`` is true while such a module's own forward runs (what it saves for
    backward, W needs too; see the module's docstring)."""

    def __init__(self, module: nn.Module) -> None:
        self.layers = [
            m for m in module.modules() if any(p.requires_grad for p in m.parameters(recurse=False))
        ]
        self._out: Layers | None = None
        self._depth = 0  # parameter-owning modules whose forward is running now
        # each layer's trainable parameters, listed once: the hook runs at every forward, and
        # walking ``parameters()`` there cost as much as a small layer's compute (measured)
        self._params = {
            id(m): [p for p in m.parameters(recurse=False) if p.requires_grad] for m in self.layers
        }
        # nn.Linear with all its parameters trainable: W may compute grad.T @ x itself
        self._linear = {
            id(m)
            for m in self.layers
            if type(m) is nn.Linear and len(self._params[id(m)]) == (1 if m.bias is None else 2)
        }
        for layer in self.layers:
            layer.register_forward_pre_hook(self._enter)
            layer.register_forward_hook(self._hook)

    def inside(self) -> bool:
        return self._depth > 0

    def _enter(self, layer: nn.Module, args: object) -> None:
        self._depth += 1

    def _hook(self, layer: nn.Module, args: object, out: object) -> None:
        self._depth -= 1
        if self._out is not None and isinstance(out, torch.Tensor) and out.requires_grad:
            params = self._params[id(layer)]
            x = args[0] if isinstance(args, tuple) and args else None
            direct = (
                id(layer) in self._linear
                and isinstance(x, torch.Tensor)
                and x.dim() == 2
                and x.dtype == torch.float32
                and not torch.is_autocast_enabled(x.device.type)
            )
            self._out.append((get_gradient_edge(out), params, x if direct else None))

    @contextmanager
    def recording(self) -> Iterator[Layers]:
        """Record where the layer outputs of the forwards run inside enter the graph."""
        out: Layers = []
        self._out = out
        try:
            yield out
        finally:
            self._out = None
            self._depth = 0  # a forward that raised left its pre-hook's count behind


def backward_input(
    out: torch.Tensor,
    grad: torch.Tensor | None,
    inp: torch.Tensor | None,
    layers: Layers,
) -> tuple[torch.Tensor | None, PendingW]:
    """B: the gradient of ``inp`` (None when it needs none) and what W will need."""
    wanted = [e for e, _, _ in layers]
    if inp is not None:
        wanted.append(get_gradient_edge(inp))  # the input's own edge: a leaf's AccumulateGrad
    if not wanted:
        return None, PendingW()
    got = torch.autograd.grad(out, wanted, grad, retain_graph=True, allow_unused=True)
    grads: list[torch.Tensor | None] = list(got[: len(layers)])
    pending = PendingW(
        [e for e, _, _ in layers], grads, [p for _, p, _ in layers], [x for _, _, x in layers]
    )
    pending.nbytes = sum(g.numel() * g.element_size() for g in grads if g is not None)
    return (got[-1] if inp is not None else None), pending


def backward_weight(pending: PendingW) -> None:
    """W: every recorded layer's parameter gradients, added into ``.grad``."""
    for t, g, params, x in zip(
        pending.outputs, pending.grads, pending.params, pending.inputs, strict=True
    ):
        if g is None or not params:
            continue
        got: tuple[torch.Tensor | None, ...]
        if x is not None:  # nn.Linear: weight [, bias], as AddmmBackward0 computes them
            with torch.no_grad():  # x is part of the graph: no history on the gradient
                got = (g.t().mm(x), g.sum(0))[: len(params)]
        else:
            # the graph is kept: a layer nested in another lies on its parent's path to its
            # weights
            got = torch.autograd.grad([t], params, [g], retain_graph=True, allow_unused=True)
        for p, pg in zip(params, got, strict=True):
            if pg is None:
                continue
            if p.grad is None:
                p.grad = pg
            else:
                p.grad.add_(pg)
