"""Register benchmark-only variants of an algorithm in this process and in every spawned rank.

The bench's ranks are started with the ``spawn`` method: fresh interpreters that
import only what they unpickle. A variant registered in the parent alone would be
unknown there. :class:`InRanks` calls its function once where it is made and
again wherever it is unpickled, so putting one into the arguments the ranks
receive registers the variants in each rank before it runs. (Not at import:
``disttrain bench`` imports every benchmark module to list them, and a variant
registered then would show up in ``bench allreduce --algorithms all``.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["InRanks"]


class InRanks:
    """``fn(*args)`` now and on unpickling; ``fn`` must be a module-level function."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args
        fn(*args)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (InRanks, (self.fn, *self.args))
