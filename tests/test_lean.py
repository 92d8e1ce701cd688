"""disttrain/lean.py: workers step optimizers without importing torch._dynamo, with the same
results, and torch's own path comes back once torch._dynamo is loaded."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.harness import run_world

_PROBE = r"""
import json, sys, torch
from disttrain import lean
patched = lean.apply()
results = []
for name in ("SGD", "Adam", "AdamW"):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    opt = getattr(torch.optim, name)(model.parameters(), lr=0.1)
    hooked = []
    opt.register_step_post_hook(lambda o, a, k: hooked.append(1))
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(4, 8)).square().sum().backward()
        opt.step()
    results.append((model.weight.sum().item(), len(hooked), torch.is_grad_enabled()))
print(json.dumps([patched, "torch._dynamo" in sys.modules, results]))
"""


def _probe(lean_on: bool) -> tuple[int, bool, list[tuple[float, int, bool]]]:
    code = _PROBE if lean_on else _PROBE.replace("lean.apply()", "0")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    patched, loaded, results = json.loads(out)
    return patched, loaded, [tuple(r) for r in results]


def test_optimizers_step_the_same_without_importing_the_compiler() -> None:
    patched, loaded, lean_results = _probe(True)
    assert patched >= 4 and not loaded  # add_param_group & co. + three step()s; no compiler
    _, plain_loaded, plain_results = _probe(False)
    assert plain_loaded  # torch's own path imports it: what this module saves
    assert lean_results == plain_results  # same weights, step hooks ran, grad mode restored
    assert all(hooks == 3 and grad for _, hooks, grad in lean_results)


def _compile_after_lean() -> tuple[int, int, float]:
    import torch

    from disttrain import lean

    lean.apply()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    import torch._dynamo  # what torch.compile imports: from here on, torch's own wrappers

    breaks: list[int] = []
    torch._dynamo.graph_break = lambda: breaks.append(1)  # what torch's step wrapper calls
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    before = opt.add_param_group.__func__.__wrapped__  # type: ignore[attr-defined]
    opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})
    swapped = int(getattr(before, "__dynamo_disable", None).__name__ != "call")
    return len(breaks), swapped, float(model.bias.item())


def test_torch_paths_return_once_the_compiler_is_loaded() -> None:
    (breaks, swapped, bias), *_ = run_world(_compile_after_lean, 1)
    # step went through torch's wrapper (its graph break), add_param_group's cache now
    # holds torch's own disable wrapper, and the step still stepped
    assert breaks >= 1 and swapped == 1 and bias != 0.0  # the lean path breaks never
