"""A prefetching loader: a background thread prepares the next batches while the step runs.

Batch preparation (indexing, a user's transform, the copy to the device) is
moved off the training thread into a bounded queue of ``depth`` batches. On
CUDA the host tensors are pinned so the copy can overlap compute. Prefetching
hides the loader's time when it is shorter than the step: the loader runs
ahead by up to ``depth`` batches and the step finds its batch ready. A
transform that holds the GIL for its whole duration (pure Python) hides less
than one that releases it (torch ops, I/O, sleeps).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import torch

__all__ = ["BatchLoader", "Transform"]

Transform = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

_DONE = object()


class BatchLoader:
    """Yields (x, y) for each index shard; prefetches ``depth`` batches ahead if depth > 0."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        shards: Sequence[torch.Tensor],
        device: torch.device,
        depth: int = 2,
        transform: Transform | None = None,
        delay_seconds: float = 0.0,
    ) -> None:
        self.x, self.y, self.shards = x, y, shards
        self.device = device
        self.depth = depth
        self.transform = transform
        self.delay_seconds = delay_seconds  # a deliberately slow loader, for benchmarks
        self.wait_seconds = 0.0  # time the training thread spent waiting for a batch

    def _prepare(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.x[indices], self.y[indices]
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        if self.transform is not None:
            x, y = self.transform(x, y)
        if self.device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def __len__(self) -> int:
        return len(self.shards)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.depth <= 0:
            for indices in self.shards:
                start = time.perf_counter()
                batch = self._prepare(indices)
                self.wait_seconds += time.perf_counter() - start
                yield batch
            return
        yield from self._prefetched()

    def _prefetched(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        ready: queue.Queue[object] = queue.Queue(maxsize=self.depth)
        stop = threading.Event()

        def produce() -> None:
            try:
                for indices in self.shards:
                    if stop.is_set():
                        return
                    ready.put(self._prepare(indices))
                ready.put(_DONE)
            except BaseException as exc:  # hand the error to the training thread
                ready.put(exc)

        thread = threading.Thread(target=produce, name="disttrain-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                start = time.perf_counter()
                item = ready.get()
                self.wait_seconds += time.perf_counter() - start
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get_nowait()
                except queue.Empty:
                    thread.join(timeout=0.05)
