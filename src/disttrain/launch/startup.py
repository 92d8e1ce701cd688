"""The command's start-up, until its sub-command runs: Python's cyclic collector kept out
of torch's import, and a Ctrl-C that leaves at once.

The collector: torch's import makes about 170,000 objects that live as long as the
process. With the collector on, the import runs some 400 collections that free nothing,
and every later full collection (the interpreter's exit included) walks them all again.
In ``make test`` it took about 10 % of all CPU: 0.24 s in each of 660 short-lived Python
processes (``perf record -a`` over the suite, 2026-11-28); ``python -c 'import torch'``
costs 1.31 s of CPU, 0.94 s with the imports frozen. ``gc.freeze()`` moves what exists to
the permanent generation; the collector still runs for what comes next. Python's docs
advise the same before a fork, which is how our workers and ``run_world``'s ranks start.

Ctrl-C: a KeyboardInterrupt raised inside an import leaves half-imported modules behind
(a later ``numpy.ndarray`` then failed with a traceback), and a library's bare ``except``
can swallow it (the run went on). Until the sub-command runs, nothing needs undoing, so
the signal's handler writes the one line and exits 130 there and then; from there on each
sub-command handles its KeyboardInterrupt (``cluster run`` ends its nodes' processes,
``train`` its workers).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from types import FrameType

__all__ = ["begin", "freeze", "imports_done", "runs"]


def _leave_at_once(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write("disttrain: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


def begin() -> None:
    """The command's entry point (``cli.console``), before it imports torch."""
    gc.disable()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not an ignored one
        signal.signal(signal.SIGINT, _leave_at_once)


def imports_done() -> None:
    """Torch and the plug-ins are imported: freeze them, collect again. A process whose
    collector :func:`begin` did not turn off (a test calling ``cli.main``) is left as is."""
    if not gc.isenabled():
        freeze()
        gc.enable()


def runs() -> None:
    """The sub-command runs next: a Ctrl-C is a KeyboardInterrupt again, which it handles."""
    if signal.getsignal(signal.SIGINT) is _leave_at_once:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def freeze() -> None:
    """What this process holds now (its imports, a forked parent's heap) is never collected:
    later collections walk only what comes after."""
    gc.freeze()
