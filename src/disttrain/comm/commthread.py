"""A communication thread: runs blocking collectives in launch order while backward goes on.

Our own allreduce algorithms (ring, tree, ...) are blocking Python loops of
``irecv``/``isend``. Run on the training thread they would stop backward until
each bucket is summed; run here, backward keeps computing (autograd releases
the GIL in its kernels, and so do the sends and receives). One thread per
reducer keeps the order of collectives identical on every rank, which is what
makes the result correct. It works on its own process group, so that nothing
the training thread sends can be confused with it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CommThread"]

_STOP = object()


class CommThread:
    """Runs submitted functions one at a time, in order; each result comes back as a Future."""

    def __init__(self, name: str = "disttrain-comm") -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], torch.Tensor]) -> torch.futures.Future[torch.Tensor]:
        """Queue ``fn``; the Future holds its return value, or the exception it raised."""
        if not self._thread.is_alive():
            raise RuntimeError("the communication thread has stopped")
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self._queue.put((fn, fut))
        return fut

    def _loop(self) -> None:
        failed: BaseException | None = None
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn: Callable[[], torch.Tensor] = item[0]
            fut: torch.futures.Future[torch.Tensor] = item[1]
            if failed is not None:
                # A collective failed (a peer is gone): the next one's messages would meet
                # the peers' unfinished one on the same pairs (gloo aborts the process on
                # a size mismatch), so nothing more is sent on this group.
                gone = RuntimeError(f"not run: an earlier collective failed ({failed})")
                fut.set_exception(gone)  # type: ignore[arg-type]
                continue
            try:
                result = fn()
            except BaseException as exc:  # the waiting thread re-raises it
                failed = exc
                fut.set_exception(exc)  # type: ignore[arg-type]
            else:
                fut.set_result(result)
            del item, fn, fut  # what the job held (a bucket) is not kept until the next one

    def cancel(self, timeout: float) -> None:
        """Drop the work not started yet (its Futures fail) and stop, waiting up to
        ``timeout`` seconds for the running one: a peer failed and the group is about to be
        dropped, which must not happen under a send or receive of this thread."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                item[1].set_exception(RuntimeError("cancelled: a peer failed"))
        self.close(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the work already queued (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
