"""Worker start-up without ``torch._dynamo``: 0.8 s of CPU less per worker process.

torch imports its compiler (``torch._dynamo``, with sympy) lazily, at the first call of
two decorators in ``torch.optim``: ``_disable_dynamo`` (``Optimizer.add_param_group``,
``zero_grad``, ``state_dict`` ... : on first use it asks ``torch._dynamo.disable`` for
a wrapper and caches it on the function as ``__dynamo_disable``) and
``_use_grad_for_differentiable`` (every ``step``: ``import torch._dynamo`` to call
``graph_break()``). Outside a ``torch.compile`` region both are no-ops, and a process that
has not imported ``torch._dynamo`` cannot be inside one. So until it is imported:

- each ``_disable_dynamo`` function gets a cache entry that calls the function itself,
  and replaces itself with torch's own wrapper once ``torch._dynamo`` is loaded;
- each optimizer class's ``step`` runs the original under the same grad mode
  (``defaults["differentiable"]``) without the import, and goes through torch's own
  wrapper once ``torch._dynamo`` is loaded (a ``torch.compile`` later in the process
  finds torch's behaviour unchanged).

Applied by our worker processes and the test harness's ranks (``launch/worker.py``,
``launch/spawn.py``), not by ``import disttrain`` in a user's script. What it saves:
benchmarks/RESULTS.md, "Test suite". On a torch whose decorators look different,
nothing is patched (:func:`apply` returns how many were; ``tests/test_lean.py``
checks the pinned torch).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["apply", "defer_disables"]

_DYNAMO = "torch._dynamo"


def _closure(fn: Any) -> dict[str, Any]:
    cells = (c.cell_contents for c in fn.__closure__)
    return dict(zip(fn.__code__.co_freevars, cells, strict=True))


def _defer_disable(fn: Callable[..., Any], recursive: bool) -> Callable[..., Any]:
    """A ``__dynamo_disable`` cache entry: ``fn`` itself until torch._dynamo is loaded."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if _DYNAMO in sys.modules:  # torch.compile may be running: torch's own wrapper
            import torch._dynamo

            real = torch._dynamo.disable(fn, recursive, wrapping=False)
            fn.__dynamo_disable = real  # type: ignore[attr-defined]
            return real(*args, **kwargs)
        return fn(*args, **kwargs)

    return call


def defer_disables(owner: type) -> int:
    """Defer every ``_disable_dynamo`` method of ``owner``; how many were found.

    Safe in any process for a class of ours (it changes only that class's methods): a
    ``TorchDispatchMode`` subclass's ``__torch_dispatch__`` is wrapped so by torch itself
    (``dataparallel/gather.py``'s read guard)."""
    import torch._compile

    inner = torch._compile._disable_dynamo(lambda: None).__code__
    found = 0
    for attr in vars(owner).values():
        if getattr(attr, "__code__", None) is inner:
            cells = _closure(attr)
            fn = cells["fn"]
            if getattr(fn, "__dynamo_disable", None) is None:
                fn.__dynamo_disable = _defer_disable(fn, cells["recursive"])
            found += 1
    return found


def _patch_step(cls: type[torch.optim.Optimizer]) -> bool:
    """Give ``cls.step`` a path without the import; False if its wrapper is not torch's."""
    from torch.optim import optimizer

    use_grad = optimizer._use_grad_for_differentiable(lambda: None).__code__
    wrapper = vars(cls).get("step")
    if getattr(wrapper, "__disttrain_lean__", False):
        return True
    inner = wrapper
    while inner is not None and getattr(inner, "__code__", None) is not use_grad:
        inner = getattr(inner, "__wrapped__", None)
    if wrapper is None or inner is None or getattr(wrapper, "hooked", False):
        return False  # not torch's decorator, or an optimizer exists (its hooks wrap step)
    func = _closure(inner)["func"]

    @functools.wraps(wrapper)
    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if _DYNAMO in sys.modules:
            return wrapper(self, *args, **kwargs)
        previous = torch.is_grad_enabled()
        try:  # what torch's wrapper does, less the graph break (a no-op outside compile)
            torch.set_grad_enabled(self.defaults["differentiable"])
            return func(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(previous)

    step.__disttrain_lean__ = True  # type: ignore[attr-defined]
    cls.step = step  # type: ignore[method-assign]
    return True


def apply() -> int:
    """Defer torch._dynamo in this process (unless it is loaded already); patches made."""
    if _DYNAMO in sys.modules:
        return 0
    patched = defer_disables(torch.optim.Optimizer)
    for cls in vars(torch.optim).values():  # every optimizer torch ships (ours build on them)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer):
            patched += _patch_step(cls)
    return patched
