"""When a parameter server applies gradients and when it lets a worker go on: the four modes.

Pure bookkeeping, no sockets and no tensors, so every rule is tested directly.
One :class:`Consistency` object serves one shard. The server calls
:meth:`~Consistency.receive` for each pushed gradient, then applies every
:meth:`~Consistency.take_batch` (the mean of its gradients is one update), then
answers the workers :meth:`~Consistency.releasable` returns with its weights.

- ``sync``: a batch is one gradient from every live worker; all wait for it.
  The mean of N gradients of B/N samples is the gradient of the whole batch,
  so this is synchronous data parallelism.
- ``async``: each gradient is applied as it arrives; nobody waits (Dean et al.
  2012, Downpour SGD).
- ``ssp``: applied as in async, but a worker whose clock is more than
  ``staleness_bound`` ahead of the slowest live worker is held (Ho et al. 2013,
  Stale Synchronous Parallel). Bound 0 is a barrier after every step.
- ``softsync``: any S gradients make a batch; nobody waits (Zhang et al. 2016).

Two staleness figures are recorded for every applied gradient:

- ``staleness``: updates applied to the shard since the weights the gradient
  was computed on were sent (Zhang et al.'s sigma). Plain async with N equal
  workers gives about N-1. ``--staleness-lr`` divides the learning rate by it (in async
  and ssp relative to the shard's recent mean: :class:`RelativeStaleness`).
- ``clock_gap``: the pushing worker's clock minus the slowest live worker's
  clock, in steps: the quantity SSP bounds. It is at most ``staleness_bound``
  in ssp mode by construction of the hold rule, and 0 in sync mode.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["MODES", "Batch", "Consistency", "Entry", "RelativeStaleness", "staleness_lr_scale"]

MODES = ("sync", "async", "ssp", "softsync")


def staleness_lr_scale(staleness: Sequence[int]) -> float:
    """The factor on the learning rate for one update: 1 / mean staleness (at least 1).

    Zhang et al. 2016 ("Staleness-aware async-SGD") set alpha = alpha0 / <sigma>,
    <sigma> the average staleness of the gradients averaged into the update. A
    gradient computed on the current weights (sigma = 0) keeps the full rate.
    """
    if not staleness:
        return 1.0
    return 1.0 / max(1.0, sum(staleness) / len(staleness))


@dataclass
class RelativeStaleness:
    """async and ssp under ``--staleness-lr``: each update's 1/σ over the mean 1/σ of the
    shard's last ``window`` updates (this one included), times the push share the server
    applies anyway (1/N). Stale pushes move less and fresh ones more, as in Zhang et al.,
    but the mean step stays the share: when the machine's load makes every gradient
    staler, the factors keep their mean (the plain 1/σ fell with the load: issue 51's
    command lost 1.6 points beside two busy processes, benchmarks/RESULTS.md)."""

    window: int
    recent: deque[float] = field(default_factory=deque)

    def factor(self, staleness: Sequence[int]) -> float:
        h = staleness_lr_scale(staleness)
        self.recent.append(h)
        if len(self.recent) > self.window:
            self.recent.popleft()
        return h * len(self.recent) / sum(self.recent)


@dataclass(frozen=True)
class Entry:
    """One received gradient waiting to be applied; the server keys its tensor by ``token``."""

    token: int
    worker: int
    read_version: int


@dataclass(frozen=True)
class Batch:
    """Gradients to average into one update, and each one's staleness at that update."""

    entries: tuple[Entry, ...]
    staleness: tuple[int, ...]


@dataclass
class Consistency:
    """Clocks, versions, held workers and staleness records of one shard."""

    mode: str
    workers: tuple[int, ...]
    staleness_bound: int = 0
    softsync: int = 0
    budget: int = 0  # gradients to receive in all before everyone stops (0: no limit)
    version: int = 0
    stopped: bool = False
    received: int = 0
    discarded: int = 0
    staleness: Counter[int] = field(default_factory=Counter)
    clock_gap: Counter[int] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        self.workers = tuple(self.workers)
        self.clocks = dict.fromkeys(self.workers, 0)
        self.read_version = dict.fromkeys(self.workers, 0)
        self.live = set(self.workers)
        self.done: set[int] = set()
        self.lost: list[int] = []
        self.waiting: set[int] = set()
        self.buffer: list[Entry] = []
        self._tokens = 0
        if self.mode == "softsync" and not 0 <= self.softsync <= len(self.workers):
            raise ValueError(f"softsync {self.softsync} is outside 1..{len(self.workers)}")

    # --- events -------------------------------------------------------------------
    @property
    def active(self) -> set[int]:
        """Live workers still training."""
        return self.live - self.done

    def receive(self, worker: int, valid: bool = True) -> int | None:
        """Worker ``worker`` pushed a gradient (``valid=False``: rejected, it only ticks the clock).

        Returns the token under which the server keeps the gradient until it is
        applied, or None when it will not be applied (rejected, or pushed after
        the job's work was done).
        """
        if worker not in self.active:
            raise ValueError(f"worker {worker} is not training (lost or done)")
        self.waiting.add(worker)
        if self.stopped:
            self.discarded += 1
            return None
        slowest = min(self.clocks[w] for w in self.active)
        self.clock_gap[self.clocks[worker] - slowest] += 1
        self.clocks[worker] += 1
        self.received += 1
        if self.budget and self.received >= self.budget:
            self.stopped = True
        if not valid:
            return None
        self._tokens += 1
        self.buffer.append(Entry(self._tokens, worker, self.read_version[worker]))
        return self._tokens

    def finish(self, worker: int) -> None:
        """Worker ``worker`` has no more steps to run."""
        self.done.add(worker)
        self.waiting.discard(worker)

    def drop(self, worker: int) -> None:
        """Worker ``worker`` died: it no longer holds anyone back; its applied work stays."""
        if worker in self.live:
            self.live.discard(worker)
            self.waiting.discard(worker)
            self.lost.append(worker)

    # --- decisions ----------------------------------------------------------------
    def _batch_size(self) -> int | None:
        """How many buffered gradients make the next update now (None: not yet)."""
        n = len(self.buffer)
        if n == 0:
            return None
        if self.stopped or not self.active:
            return n if self.mode in ("sync", "softsync") else 1  # flush what is left
        if self.mode in ("async", "ssp"):
            return 1
        if self.mode == "softsync":
            s = self.softsync or len(self.workers)
            s = max(1, min(s, len(self.active)))
            return s if n >= s else None
        # sync: every active worker has pushed this round (each is held until it ends)
        return n if self.active <= self.waiting else None

    def take_batch(self) -> Batch | None:
        """The next update to apply, or None; the caller must apply it (the version advances)."""
        size = self._batch_size()
        if size is None:
            return None
        entries, self.buffer = tuple(self.buffer[:size]), self.buffer[size:]
        staleness = tuple(self.version - e.read_version for e in entries)
        self.staleness.update(staleness)
        self.version += 1
        return Batch(entries, staleness)

    def releasable(self) -> list[int]:
        """Held workers that may now have the current weights (and compute their next step)."""
        if not self.waiting:
            return []
        if self.stopped or self.mode in ("async", "softsync"):
            out = sorted(self.waiting)
        elif self.mode == "sync":
            round_over = self.active <= self.waiting and not self.buffer
            out = sorted(self.waiting) if round_over else []
        else:  # ssp: hold a worker more than s clocks ahead of the slowest
            slowest = min(self.clocks[w] for w in self.active)
            out = sorted(
                w for w in self.waiting if self.clocks[w] - slowest <= self.staleness_bound
            )
        for w in out:
            self.waiting.discard(w)
            self.read_version[w] = self.version
        return out

    def all_finished(self) -> bool:
        """Every live worker is done, and nothing is left to apply."""
        return not self.active and not self.buffer

    def figures(self) -> dict[str, object]:
        """Staleness and clock records for summary.json."""
        return {
            "version": self.version,
            "received": self.received,
            "discarded_after_stop": self.discarded,
            "worker_steps": {str(w): c for w, c in sorted(self.clocks.items())},
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness.items())},
            "clock_gap_histogram": {str(k): v for k, v in sorted(self.clock_gap.items())},
        }
