"""Where the training thread's seconds go: nested phases, each second booked to one phase only.

The trainer times each part of a step under a phase (``compute`` around
forward + backward, ``communication`` around the strategy's exchange). Code
deep inside those parts knows better what it is doing at a given moment: a
pipeline stage waiting for its neighbour's activation inside "compute", a
one-bit exchange encoding its payload inside "communication". It says so
with a nested phase::

    with phases.book("communication"):   # inside the trainer's "compute"
        work.wait()

and those seconds are booked to the inner phase and taken out of the outer
one, so the phases never overlap and add up to at most the wall time.

A phase opened on a thread where no ledger is open (the reducer's
communication thread, a benchmark calling an algorithm directly) books
nothing: only the thread that the trainer times is accounted, and its
seconds are counted once. The stack of open phases is per thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager

__all__ = ["CODEC", "COMMUNICATION", "COMPUTE", "book"]

#: Forward, backward and the optimizer: the model's own arithmetic.
COMPUTE = "compute"
#: Sending, receiving, and waiting for a peer's message or collective.
COMMUNICATION = "communication"
#: Encoding and decoding compressed payloads (one-bit, top-k codes), apart from communication.
CODEC = "codec"


class _Frame:
    __slots__ = ("ledger", "nested")

    def __init__(self, ledger: MutableMapping[str, float]) -> None:
        self.ledger = ledger
        self.nested = 0.0  # seconds of this frame spent in phases nested inside it


_local = threading.local()


def _stack() -> list[_Frame]:
    stack: list[_Frame] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@contextmanager
def book(phase: str, ledger: MutableMapping[str, float] | None = None) -> Iterator[None]:
    """Book the seconds spent inside as ``phase``, minus those of phases nested inside it.

    ``ledger`` (phase -> seconds) is where they go; without one, the ledger of
    the innermost open phase on this thread, or nowhere if none is open.
    """
    stack = _stack()
    if ledger is None:
        if not stack:
            yield
            return
        ledger = stack[-1].ledger
    frame = _Frame(ledger)
    stack.append(frame)
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        stack.pop()
        ledger[phase] = ledger.get(phase, 0.0) + elapsed - frame.nested
        if stack:
            stack[-1].nested += elapsed
