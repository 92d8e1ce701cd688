"""Stage 3's read guard dispatches without importing torch._dynamo (1.5 s of CPU per rank).

A fresh interpreter: the test process may have loaded the compiler already, and then
torch's own wrapper is the right one (disttrain/lean.py)."""

from __future__ import annotations

import subprocess
import sys

_PROBE = r"""
import sys, torch
from disttrain.dataparallel.gather import _ReadGuard
class Gatherer:
    quiet = True  # our own ops: the guard lets them be
with _ReadGuard(Gatherer()):
    total = (torch.ones(3) + 1).sum().item()
print(total, "torch._dynamo" in sys.modules)
"""


def test_the_read_guard_does_not_import_the_compiler() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.split() == ["6.0", "False"], out
