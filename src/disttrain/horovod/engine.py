"""The engine under Horovod's calls: one thread that runs them in order, handles, and join.

Horovod queues every collective and returns a handle at once; a background thread
runs it later. Here the thread is :class:`~disttrain.comm.commthread.CommThread`
on a process group of the engine's own, so ``poll`` can say False while a
collective is still running. Calls are matched across ranks **in call order**,
not by name as Horovod's coordinator does: every rank must issue the same
collectives in the same order (docs/horovod.md, "Differences").

Before any data moves, each call's ranks agree on it with one small MAX-allreduce
of a header (the idea of ``--check-collectives``, collectives/checks.py): a CRC of
the call's signature (kind, name, dtype, shape, reduce op, root, scale factors) and
its length, with their negatives, so the maximum shows whether every rank sent the
same. A mismatch is then a :class:`HorovodInternalError` on every rank, and no data
moves (gloo would hang or abort on a length mismatch). The header also carries what
a rank that has called :func:`join` needs to serve the others' allreduces with zeros:
the length, wire dtype and reduce op.

``shutdown()`` sends one last header, flagged *leaving*, after the rank's queued calls.
A peer whose call meets it fails that call and every later one with Horovod's
"Horovod has been shut down" (a HorovodInternalError) and sends nothing more: it does
not wait for a partner that is gone (gloo's 60 s timeout, then a group that later
calls cannot use). Such an engine, or one whose transport failed, is *gone*; the
next ``hvd.init()`` starts a new one.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain import timeline
from disttrain.comm.commthread import CommThread
from disttrain.horovod.exceptions import HorovodInternalError

__all__ = ["Call", "Engine", "current", "start", "stop"]

# Kinds of call; ALLREDUCE is the one a joined rank serves with zeros.
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, ADASUM = range(1, 8)
KIND_NAMES = {
    ALLGATHER: "allgather",
    BROADCAST: "broadcast",
    ALLTOALL: "alltoall",
    REDUCESCATTER: "reducescatter",
    ADASUM: "Adasum allreduce",
}

#: wire dtypes by index (the header carries the index)
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]
REDUCE_OPS = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]

_LOW = -(1 << 62)  # a joined rank's entry: below anything an active rank sends
# active, joined, crc, -crc, numel, -numel, dtype, kind, reduce op, first join, leaving
_HEADER = 11
SHUT_DOWN = (
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an "
    "attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished "
    "execution."
)


@dataclass
class Call:
    """One collective: what the ranks must agree on, and the work once they have."""

    kind: int
    signature: str  # kind, name, dtype, shape, op, root, factors: equal on every rank
    body: Callable[[], Any]
    numel: int = 0
    wire: torch.dtype = torch.float32
    reduce_op: int = 0  # index into REDUCE_OPS


@dataclass
class Failed:
    """A call the ranks refused together (their message): the thread goes on after it."""

    message: str


@dataclass
class Handle:
    future: torch.futures.Future[Any]
    names: list[str]
    keep: Any = None  # inputs kept alive until synchronize, as Horovod does
    done: list[bool] = field(default_factory=lambda: [False])


class Engine:
    """The running engine of one ``hvd.init()``: its thread, group, handles and names."""

    def __init__(self, group: ProcessGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.thread = CommThread("horovod")
        self.handles: dict[int, Handle] = {}
        self.inflight: set[str] = set()
        self.next_handle = 1
        self.lock = threading.Lock()
        # why no call can run any more (a peer shut down, the transport failed), or None
        self.gone: str | None = None
        # hvd.start_timeline's: each call's agreement and data as spans, on its name's lane
        self.timeline: timeline.Recorder | None = None

    # --- submission (the caller's thread) ------------------------------------------------
    def submit(
        self,
        prefix: str,
        name: str | None,
        calls: list[Call],
        group: ProcessGroup,
        finish: Callable[[list[Any]], Any],
        keep: Any = None,
    ) -> int:
        """Queue ``calls`` (run in order, one handle); ``finish`` turns their results into
        the handle's output. A name still in flight on this rank is a ValueError now."""
        with self.lock:
            handle = self.next_handle
            self.next_handle += 1
            base = f"{prefix}.{name}" if name is not None else f"{prefix}.noname.{handle}"
            names = (
                [base]
                if len(calls) == 1
                else [f"{base}_{i}of{len(calls)}" for i in range(1, len(calls) + 1)]
            )
            if name is not None and self.inflight.intersection(names):
                raise ValueError(
                    f"Requested to {prefix} a tensor with the same name as another tensor that "
                    f"is currently being processed: {base}"
                )
            self.inflight.update(names)
        # an unnamed call's handle differs between ranks that issued other calls: only a
        # name the user gave takes part in the agreement
        agreed = names if name is not None else [prefix] * len(calls)
        job = cast(
            Callable[[], torch.Tensor], lambda: self._run(calls, names, agreed, group, finish)
        )
        self.handles[handle] = Handle(self.thread.submit(job), names, keep)
        return handle

    def poll(self, handle: int) -> bool:
        if handle not in self.handles:
            raise ValueError(f"Handle {handle} was not created or has been cleared.")
        return bool(self.handles[handle].future.done())

    def wait(self, handle: int) -> Any:
        """The output of ``handle`` (removed); None for an unknown one, as Horovod."""
        entry = self.handles.pop(handle, None)
        if entry is None:
            return None
        try:
            result = entry.future.wait()
        except Exception as exc:  # a lost peer, a timeout: the thread has stopped
            raise HorovodInternalError(str(exc)) from exc
        if isinstance(result, Failed):
            raise HorovodInternalError(result.message)
        return result

    # --- execution (the engine's thread) -------------------------------------------------
    def _run(
        self,
        calls: list[Call],
        names: list[str],
        agreed: list[str],
        group: ProcessGroup,
        finish: Callable[[list[Any]], Any],
    ) -> Any:
        try:
            results: list[Any] = []
            failed: Failed | None = None
            for call, name, shown in zip(calls, agreed, names, strict=True):
                recorder, start = self.timeline, timeline.CLOCK()
                refused = self.gone or self._agree(call, name, group)
                if refused is not None:  # every rank saw it: all go on to the next call
                    failed = failed or Failed(refused)
                    continue
                agreed_at = timeline.CLOCK()
                results.append(call.body())
                if recorder is not None:  # Horovod's activity names: NEGOTIATE_X, then X
                    kind = shown.split(".")[0].removeprefix("grouped_").upper()
                    recorder.complete(f"NEGOTIATE_{kind}", shown, start, agreed_at)
                    recorder.complete(kind, shown, agreed_at, timeline.CLOCK())
            return failed if failed is not None else finish(results)
        except Exception as exc:  # the transport failed: this group carries nothing more
            self.gone = f"{SHUT_DOWN} (the transport failed: {exc})"
            raise
        finally:
            with self.lock:
                self.inflight.difference_update(names)

    def _agree(self, call: Call, name: str, group: ProcessGroup) -> str | None:
        """Exchange the header; the reason all ranks refuse the call, or None."""
        if dist.get_world_size(group) == 1:
            return None
        crc = zlib.crc32(f"{name}|{call.signature}".encode()) & 0x7FFFFFFF
        header = torch.tensor(
            [
                1,
                0,
                crc,
                -crc,
                call.numel,
                -call.numel,
                DTYPES.index(call.wire),
                call.kind,
                call.reduce_op,
                0,
                0,
            ]
        )
        dist.all_reduce(header, op=dist.ReduceOp.MAX, group=group)
        if int(header[10]):  # a rank is shutting down: it sends nothing more
            self.gone = SHUT_DOWN
            return SHUT_DOWN
        if int(header[1]) and call.kind not in (ALLREDUCE, BARRIER):
            return f"{KIND_NAMES[call.kind]} ({name}) is not supported with Join at this time"
        if int(header[2]) != -int(header[3]) or int(header[4]) != -int(header[5]):
            return (
                f"mismatched collective {name}: this rank called {call.signature}, another "
                "rank differs (operation, name, dtype, shape, reduce op, root or scale factors)"
            )
        return None

    def join(self) -> int:
        """Serve the others' allreduces with zeros until every rank has joined; return the
        rank that joined last (the highest such rank when several joined in the last round)."""
        job = cast(Callable[[], torch.Tensor], self._serve_joined)
        try:
            return int(cast(Any, self.thread.submit(job).wait()))
        except Exception as exc:
            raise HorovodInternalError(str(exc)) from exc

    def _serve_joined(self) -> int:
        if self.gone is not None:
            raise HorovodInternalError(self.gone)
        first = True
        while True:
            header = torch.tensor(
                [0, 1, -1, _LOW, -1, _LOW, -1, -1, -1, self.rank + 1 if first else 0, 0]
            )
            first = False
            if dist.get_world_size(self.group) > 1:
                dist.all_reduce(header, op=dist.ReduceOp.MAX, group=self.group)
            if int(header[10]):
                self.gone = SHUT_DOWN
                raise HorovodInternalError(SHUT_DOWN)
            if int(header[0]) == 0:  # nobody is active any more
                return int(header[9]) - 1
            agreed = int(header[2]) == -int(header[3]) and int(header[4]) == -int(header[5])
            if agreed and int(header[7]) == ALLREDUCE:
                zeros = torch.zeros(int(header[4]), dtype=DTYPES[int(header[6])])
                dist.all_reduce(zeros, op=REDUCE_OPS[int(header[8])], group=self.group)

    def leave(self) -> None:
        """Tell the peers this rank is shutting down: one header flagged *leaving*, after
        the calls already queued (a peer whose call meets it fails it, and is gone). It
        also waits until every rank has finished the groups it was forming (a rank that
        destroys its groups while a peer still connects one makes that peer fail). Nothing
        is sent by an engine that is gone: its peers no longer listen."""
        job = cast(Callable[[], torch.Tensor], self._send_leaving)
        with contextlib.suppress(Exception):  # a peer already gone costs only its timeout
            self.thread.submit(job).wait()
        self.gone = self.gone or SHUT_DOWN

    def _send_leaving(self) -> None:
        if self.gone is not None or dist.get_world_size(self.group) == 1:
            return
        header = torch.tensor([_LOW] * 10 + [1])
        dist.all_reduce(header, op=dist.ReduceOp.MAX, group=self.group)

    def close(self) -> None:
        self.thread.close()
        self.handles.clear()


_engine: Engine | None = None


def start(group: ProcessGroup, rank: int) -> Engine:
    global _engine
    _engine = Engine(group, rank)
    return _engine


def stop() -> None:
    global _engine
    if _engine is not None:
        _engine.close()
    _engine = None


def current() -> Engine:
    """The running engine; Horovod's ValueError before ``hvd.init()``."""
    if _engine is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return _engine


def current_size() -> int:
    """The job's size (the engine's group)."""
    return dist.get_world_size(current().group)
