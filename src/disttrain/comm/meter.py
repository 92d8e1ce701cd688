"""One meter for every byte and message that disttrain's own code sends, per peer.

Our collectives and strategies call :func:`record_send` for each point-to-point
message. Backend-native collectives (``torch.distributed.all_reduce``) cannot be
observed from Python, so they record the traffic their algorithm is documented
to send (gloo's ring: 2(n-1)/n·S), flagged as ``estimated``.

Threads: a communication thread records while the training thread reads, so
every update and read holds one lock (a read-modify-write of a dict entry is
not atomic across threads, and a new peer's key would change the dict's size
under a reader's sum). :meth:`Meter.paused` leaves out what every thread sends
meanwhile (ZeRO-3's evaluation gathers run on its gather thread); a thread
whose sends are training traffic whatever the training thread is doing (a
streaming DiLoCo fragment still in flight across an evaluation) runs them in
:meth:`Meter.counting`.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

__all__ = ["Meter", "MeterSnapshot", "Tally", "meter", "record_copy", "record_send"]


@dataclass
class Tally:
    """What one thread sent inside :meth:`Meter.counting` (exact whatever other threads send)."""

    bytes_sent: int = 0
    messages_sent: int = 0


@dataclass
class MeterSnapshot:
    """Totals at one moment: bytes and messages sent, in all and per peer."""

    bytes_sent: int = 0
    messages_sent: int = 0
    estimated_bytes: int = 0
    bytes_copied: int = 0  # through memory shared with peers (not sent: no peer, no message)
    per_peer_bytes: dict[int, int] = field(default_factory=dict)
    per_peer_messages: dict[int, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {
            "bytes_sent": self.bytes_sent,
            "messages_sent": self.messages_sent,
            "estimated_bytes": self.estimated_bytes,
            "bytes_copied": self.bytes_copied,
            "per_peer_bytes": {str(k): v for k, v in sorted(self.per_peer_bytes.items())},
            "per_peer_messages": {str(k): v for k, v in sorted(self.per_peer_messages.items())},
        }


class Meter:
    """Counts bytes and messages sent by this process, per destination rank."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()  # .tallies: this thread's open counting() blocks
        self.reset()

    def reset(self) -> None:
        self._paused = 0
        self._bytes: defaultdict[int, int] = defaultdict(int)
        self._messages: defaultdict[int, int] = defaultdict(int)
        self._estimated = 0
        self._copied = 0

    def record(self, peer: int, nbytes: int, messages: int = 1, estimated: bool = False) -> None:
        """Count ``messages`` messages totalling ``nbytes`` bytes sent to global rank ``peer``."""
        tallies: list[Tally] = getattr(self._local, "tallies", [])
        if self._paused and not tallies:
            return
        for tally in tallies:  # this thread's own: no other thread touches them
            tally.bytes_sent += nbytes
            tally.messages_sent += messages
        with self._lock:
            self._bytes[peer] += nbytes
            self._messages[peer] += messages
            if estimated:
                self._estimated += nbytes

    def record_copy(self, nbytes: int) -> None:
        """Count ``nbytes`` copied into or out of memory shared with peers (shm collectives)."""
        if not self._paused or getattr(self._local, "tallies", []):
            with self._lock:
                self._copied += nbytes

    @property
    def bytes_copied(self) -> int:
        return self._copied

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Leave out what is sent inside (evaluation, end-of-run bookkeeping)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    @contextmanager
    def counting(self) -> Iterator[Tally]:
        """Count what this thread sends inside even while the meter is paused; the tally
        yielded holds this thread's sends alone (a communication thread's exact bytes)."""
        tally = Tally()
        if not hasattr(self._local, "tallies"):
            self._local.tallies = []
        self._local.tallies.append(tally)
        try:
            yield tally
        finally:
            self._local.tallies.pop()  # blocks nest: the last opened closes first

    def on_behalf(self, fn: Callable[[], T]) -> Callable[[], T]:
        """``fn``, to run on a helper thread that sends for this one (the hierarchical
        allreduce's network part): its sends also count in this thread's open tallies."""
        tallies = list(getattr(self._local, "tallies", []))

        def run() -> T:
            self._local.tallies = tallies
            try:
                return fn()
            finally:
                self._local.tallies = []

        return run

    @property
    def bytes_sent(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    @property
    def messages_sent(self) -> int:
        with self._lock:
            return sum(self._messages.values())

    def snapshot(self) -> MeterSnapshot:
        with self._lock:
            return MeterSnapshot(
                bytes_sent=sum(self._bytes.values()),
                messages_sent=sum(self._messages.values()),
                estimated_bytes=self._estimated,
                bytes_copied=self._copied,
                per_peer_bytes=dict(self._bytes),
                per_peer_messages=dict(self._messages),
            )


#: The process-wide meter. Strategies read it for ``bytes_sent_per_rank``.
meter = Meter()


def record_send(peer: int, nbytes: int, messages: int = 1, estimated: bool = False) -> None:
    """Count a send on the process-wide meter."""
    meter.record(peer, nbytes, messages, estimated)


def record_copy(nbytes: int) -> None:
    """Count bytes copied through shared memory on the process-wide meter."""
    meter.record_copy(nbytes)
