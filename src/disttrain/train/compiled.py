"""``--compile BACKEND``: each worker's model forward through ``torch.compile``.

The forward method is replaced by its compiled form on the module itself
(``model.forward = torch.compile(model.forward, backend=...)``), so the module, its
parameters, hooks and ``state_dict`` keys stay as they are: checkpoints and model.pt are
those of an eager run, and a strategy's gradient hooks fire as AOTAutograd's backward
accumulates each gradient. Not ``torch.compile(model)``: its wrapper's ``state_dict``
keys gain an ``_orig_mod.`` prefix. Not ``Module.compile()``: on the pinned torch (2.13)
it compiles ``Module._call_impl``, and dynamo captured no graph from it (checked with
``torch._dynamo.utils.counters``; tests/train/test_compiled.py checks ours captures).

Every strategy compiles what its worker holds: the whole model, a pipeline stage, or a
tensor-parallel slice (whose collectives dynamo leaves to eager, a graph break each);
tests/train/test_compiled.py runs each against its eager run.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

__all__ = ["compile_forward", "graphs"]


def compile_forward(model: nn.Module, backend: str) -> nn.Module:
    """``model`` with its forward compiled by ``backend`` (in place); ``none``: as it is."""
    if backend != "none":
        # an instance attribute: nn.Module.__call__ finds it before the class's forward
        model.forward = torch.compile(model.forward, backend=backend)
    return model


def graphs() -> int:
    """The graphs ``torch.compile`` captured in this process so far (summary.json's
    ``compiled_graphs``: 0 means nothing was compiled); 0 without dynamo imported."""
    if "torch._dynamo" not in sys.modules:  # workers do not import it unless compiling
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
