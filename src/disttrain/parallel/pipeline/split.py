"""The backward split in two (zero-bubble pipelines): B, the input gradient, and W, the weights'.

During the forward, :class:`Recorder` keeps the output of every module that owns
parameters (a forward hook). B (:func:`backward_input`) asks autograd for the
gradient of the stage's input *and* of those outputs, keeping the graph: the
engine computes only what leads to the tensors asked for, so no weight gradient
is formed. W (:func:`backward_weight`) then asks, per recorded output, for its
module's parameters' gradients from the output's gradient: each layer's own
backward node once more, for the weight part only (for ``nn.Linear``: B runs
``grad @ W``, W runs ``grad.T @ x`` and ``grad.sum(0)``, the same kernels the
fused backward runs, so B + W give the fused gradients bit for bit). The
gradients are added into ``.grad`` as autograd's own accumulation does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["PendingW", "Recorder", "backward_input", "backward_weight"]


@dataclass
class PendingW:
    """What W needs of one micro-batch on one stage: each layer's output, its gradient
    (from B) and its parameters; ``nbytes`` is the gradients' size (held until W)."""

    outputs: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor | None] = field(default_factory=list)
    params: list[list[nn.Parameter]] = field(default_factory=list)
    nbytes: int = 0


class Recorder:
    """Forward hooks on every parameter-owning module of ``module`` that record outputs."""

    def __init__(self, module: nn.Module) -> None:
        self.layers = [
            m for m in module.modules() if any(p.requires_grad for p in m.parameters(recurse=False))
        ]
        self._out: list[tuple[torch.Tensor, list[nn.Parameter]]] | None = None
        # each layer's trainable parameters, listed once: the hook runs at every forward, and
        # walking ``parameters()`` there cost as much as a small layer's compute (measured)
        self._params = {
            id(m): [p for p in m.parameters(recurse=False) if p.requires_grad] for m in self.layers
        }
        for layer in self.layers:
            layer.register_forward_hook(self._hook)

    def _hook(self, layer: nn.Module, args: object, out: object) -> None:
        if self._out is not None and isinstance(out, torch.Tensor) and out.requires_grad:
            self._out.append((out, self._params[id(layer)]))

    @contextmanager
    def recording(self) -> Iterator[list[tuple[torch.Tensor, list[nn.Parameter]]]]:
        """Record the layer outputs of the forwards run inside (into the yielded list)."""
        out: list[tuple[torch.Tensor, list[nn.Parameter]]] = []
        self._out = out
        try:
            yield out
        finally:
            self._out = None


def backward_input(
    out: torch.Tensor,
    grad: torch.Tensor | None,
    inp: torch.Tensor | None,
    layers: list[tuple[torch.Tensor, list[nn.Parameter]]],
) -> tuple[torch.Tensor | None, PendingW]:
    """B: the gradient of ``inp`` (None when it needs none) and what W will need."""
    wanted = [t for t, _ in layers] + ([inp] if inp is not None else [])
    if not wanted:
        return None, PendingW()
    got = torch.autograd.grad(out, wanted, grad, retain_graph=True, allow_unused=True)
    grads: list[torch.Tensor | None] = list(got[: len(layers)])
    pending = PendingW([t for t, _ in layers], grads, [p for _, p in layers])
    pending.nbytes = sum(g.numel() * g.element_size() for g in grads if g is not None)
    return (got[-1] if inp is not None else None), pending


def backward_weight(pending: PendingW) -> None:
    """W: every recorded layer's parameter gradients, added into ``.grad``."""
    for t, g, params in zip(pending.outputs, pending.grads, pending.params, strict=True):
        if g is None or not params:
            continue
        # the graph is kept: a layer nested in another lies on its parent's path to its weights
        got = torch.autograd.grad(t, params, g, retain_graph=True, allow_unused=True)
        for p, pg in zip(params, got, strict=True):
            if pg is None:
                continue
            if p.grad is None:
                p.grad = pg
            else:
                p.grad.add_(pg)
