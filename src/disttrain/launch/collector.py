"""Python's cyclic garbage collector in our processes: off while torch imports, then the
imports' objects frozen out of its sight.

torch's import makes about 170,000 objects that live as long as the process. With the
collector on, the import runs some 400 collections that free nothing (0.2 s of the
command's 1.3 s start), and every later full collection walks all of them again. In
``make test`` the collector took about 10 % of all CPU: 0.24 s in each of 660 short-lived
Python processes (``perf record -a`` over the suite, 2026-11-28). ``gc.freeze()`` moves
what exists to the permanent generation; the collector still runs, for what the program
allocates next. Python's docs advise the same before a fork (no copy-on-write of the
counts the collector writes), which is how our workers and ``run_world``'s ranks start.
"""

from __future__ import annotations

import gc

__all__ = ["freeze", "imports_begin", "imports_done"]


def imports_begin() -> None:
    """The process's entry point (``cli.console``) is about to import torch."""
    gc.disable()


def imports_done() -> None:
    """Its imports are done: freeze them and collect again. A process whose collector we
    did not turn off (a test or a script calling ``cli.main``) is left as it is."""
    if not gc.isenabled():
        freeze()
        gc.enable()


def freeze() -> None:
    """What this process holds now (its imports, a forked parent's heap) is never collected:
    later collections walk only what comes after."""
    gc.freeze()
