"""One parameter server: a ZeroMQ ROUTER socket, a shard of the weights and its optimizer.

The loop is single-threaded and message-driven (ps-lite's design): each
message is checked, gradients are applied as :class:`Consistency` decides, and
replies go out when a held worker may go on. Workers are known by their
socket identity (``w<index>`` for requests, ``h<index>`` for heartbeats).
Liveness is a fact, not a deadline: a worker that heartbeats is alive however
long its step takes; one silent for longer than ``worker_timeout`` (its heartbeat
lapsed: a stopped or starved process) is dropped, or, in sync mode, ends the job
with an error naming it; outside sync mode one whose process is gone (its
heartbeats name it, ``HOST PID START``; seen on this host at once) is dropped
without waiting for that. A dropped worker that speaks again
is refused for good (an ERROR with ``FLAG_DROPPED``). A frame that breaks the protocol, a
gradient of the wrong dtype or size, or one holding NaN/Inf is counted and
refused: the weights and the optimizer state are left exactly as they were.
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import zmq

from disttrain.comm.errors import PeerFailure
from disttrain.comm.meter import record_send
from disttrain.comm.procstat import ended
from disttrain.ps.auth import CurveKey, secure_server
from disttrain.ps.config import ASYNCHRONOUS
from disttrain.ps.consistency import Batch, Consistency, RelativeStaleness, staleness_lr_scale
from disttrain.ps.protocol import (
    FLAG_DROPPED,
    FLAG_STOP,
    MsgType,
    ProtocolError,
    decode,
    decode_tensor,
    encode,
    encode_tensor,
)

__all__ = ["ShardServer", "bind_router"]

OptimizerFactory = Callable[[list[torch.Tensor]], torch.optim.Optimizer]


def bind_router(
    address: str = "127.0.0.1", curve: CurveKey | None = None
) -> tuple[zmq.Socket[Any], str]:
    """A ROUTER socket bound to an ephemeral port of ``address``, and its endpoint.

    With ``curve``, the socket is a CURVE server admitting only the job's key (ps/auth.py).
    """
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 5000)  # deliver the final replies before the process exits
    if curve is not None:
        secure_server(sock, curve)
    host = f"[{address}]" if ":" in address else address
    if ":" in address:
        sock.setsockopt(zmq.IPV6, 1)
    sock.bind(f"tcp://{host}:*")
    return sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)


def _peer(identity: bytes) -> tuple[str, int] | None:
    """``(kind, worker)`` from a socket identity ``w3`` / ``h3``; None if it is not ours."""
    if len(identity) < 2 or identity[:1] not in (b"w", b"h") or not identity[1:].isdigit():
        return None
    return identity[:1].decode(), int(identity[1:])


class ShardServer:
    """Serve shard ``shard`` (a flat vector) to the workers until all are done or lost."""

    def __init__(
        self,
        shard: int,
        weights: torch.Tensor,
        make_optimizer: OptimizerFactory,
        consistency: Consistency,
        sock: zmq.Socket[Any],
        *,
        staleness_lr: bool = False,
        lr_share: float = 1.0,
        worker_timeout: float = 10.0,
        rank: int = -1,
    ) -> None:
        self.shard = shard
        self.param = weights.detach().clone().requires_grad_(True)
        self.optimizer = make_optimizer([self.param])
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.cons = consistency
        self.sock = sock
        self.staleness_lr = staleness_lr
        self.lr_share = lr_share  # async/ssp: each push's share of the global batch (1/N)
        #: --staleness-lr in async/ssp: 1/staleness relative to the shard's last 4N updates
        #: (softsync: the plain 1/staleness)
        self.relative = (
            RelativeStaleness(4 * len(consistency.workers))
            if staleness_lr and consistency.mode in ASYNCHRONOUS
            else None
        )
        self.worker_timeout = worker_timeout
        self.fail_on_loss = consistency.mode == "sync"  # a sync round needs every worker
        self.rank = rank
        self.grads: dict[int, tuple[torch.Tensor, float]] = {}
        self.done_identities: dict[int, bytes] = {}
        self.rejected: Counter[str] = Counter()
        self.lost: list[dict[str, Any]] = []
        self.bytes_in = self.bytes_out = self.messages_in = self.messages_out = 0
        self.start = time.monotonic()
        self.last_seen = dict.fromkeys(consistency.workers, self.start)
        self.first_push: float | None = None
        self.work_done_at: float | None = None
        self.finished = False
        #: called with the step number after each sync round, before its replies (checkpoints);
        #: the step is the one the workers send (a PUSH's or SKIP's clock), so the servers'
        #: labels stay the workers' even when fp16 steps are skipped (no push)
        self.on_round: Callable[[int], None] | None = None
        self.steps = dict.fromkeys(consistency.workers, 0)  # each worker's last step sent
        #: (pid, start time) of each worker whose heartbeats say it runs on this host
        self.processes: dict[int, tuple[int, str]] = {}
        self._host = socket.gethostname()
        self._looked = 0.0  # when the processes were last looked at (/proc)
        #: why each dropped worker was dropped (the refusal of one that speaks again)
        self.dropped: dict[int, str] = {}

    # --- sending ------------------------------------------------------------------
    def _send(self, identity: bytes, frames: list[bytes | memoryview]) -> None:
        nbytes = sum(memoryview(f).nbytes for f in frames)
        self.sock.send_multipart(
            [identity, *frames]
        )  # copied: the weights change after this returns
        self.bytes_out += nbytes
        self.messages_out += 1
        peer = _peer(identity)
        if peer is not None:
            record_send(peer[1], nbytes)

    def _flags(self) -> int:
        return FLAG_STOP if self.cons.stopped else 0

    def _send_weights(self, identity: bytes, worker: int) -> None:
        frames = encode_tensor(
            MsgType.WEIGHTS,
            self.shard,
            worker,
            self.cons.version,
            self.param.detach(),
            self._flags(),
        )
        self._send(identity, frames)

    def _refuse(self, identity: bytes, reason: str, detail: str, flags: int = 0) -> None:
        self.rejected[reason] += 1
        frames = encode(MsgType.ERROR, self.shard, 0, 0, detail.encode(), flags=flags)
        self._send(identity, frames)

    # --- applying -----------------------------------------------------------------
    def _apply(self, batch: Batch) -> None:
        grads, rates = zip(*(self.grads.pop(e.token) for e in batch.entries), strict=True)
        if self.relative is not None:
            scale = self.relative.factor(batch.staleness)
        else:
            scale = staleness_lr_scale(batch.staleness) if self.staleness_lr else 1.0
        scale *= self.lr_share
        asked = [r for r in rates if r > 0]  # the workers' scheduled rates (warm-up, decay)
        for group, lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = (sum(asked) / len(asked) if asked else lr) * scale
        mean = grads[0] if len(grads) == 1 else torch.stack(grads).mean(dim=0)
        self.param.grad = mean
        self.optimizer.step()
        self.param.grad = None

    def _advance(self) -> None:
        """Apply what the mode allows, then answer the workers it releases."""
        while (batch := self.cons.take_batch()) is not None:
            self._apply(batch)
        if self.cons.stopped and self.work_done_at is None:
            self.work_done_at = time.monotonic()
        released = self.cons.releasable()
        if released and self.on_round is not None and self.cons.mode == "sync":
            label = max(self.steps[w] for w in released)
            if label > 0:
                self.on_round(label)
        for w in released:
            self._send_weights(f"w{w}".encode(), w)
        if self.cons.all_finished() and not self.finished:
            if self.work_done_at is None:
                self.work_done_at = time.monotonic()
            stats = json.dumps(self.figures()).encode()
            for w, identity in sorted(self.done_identities.items()):
                self._send_weights(identity, w)
                self._send(identity, encode(MsgType.STATS, self.shard, w, self.cons.version, stats))
            self.finished = True

    # --- receiving ----------------------------------------------------------------
    def handle(self, frames: list[bytes]) -> None:
        """Process one incoming message ``[identity, header, payload]``."""
        identity, body = frames[0], frames[1:]
        self.messages_in += 1
        self.bytes_in += sum(len(f) for f in body)
        # Security: a peer that is not one of this job's workers is dropped without a
        # reply (it learns nothing); a known worker's broken frame is answered with ERROR
        # so that the worker fails at once. Neither touches any state.
        peer = _peer(identity)
        if peer is None or peer[1] not in self.last_seen:
            self.rejected["unknown_worker"] += 1
            return
        try:
            header, payload = decode(body)
        except ProtocolError as exc:
            self._refuse(identity, "malformed", f"malformed frame: {exc}")
            return
        if header.worker != peer[1]:
            self._refuse(
                identity, "unknown_worker", f"worker field {header.worker} from {identity!r}"
            )
            return
        kind, worker = peer
        if worker not in self.cons.live:
            if kind == "h":  # a resumed worker's heartbeat: its next request is refused
                return
            why = self.dropped.get(worker, "lost")
            detail = f"worker {worker} was dropped as lost: {why}"
            self._refuse(identity, "lost_worker", detail, FLAG_DROPPED)
            return
        self.last_seen[worker] = time.monotonic()
        if kind == "h" or header.type == MsgType.HEARTBEAT:
            self._note_process(worker, payload)
            return
        if header.shard != self.shard:
            self._refuse(identity, "wrong_shard", f"shard {header.shard} sent to {self.shard}")
        elif header.type in (MsgType.HELLO, MsgType.PULL):
            if header.type == MsgType.HELLO and not self.cons.budget:
                # the job's work: each worker's step count, times the workers
                self.cons.budget = header.clock * len(self.cons.workers)
            self._send_weights(identity, worker)
        elif header.type == MsgType.PUSH:
            self.steps[worker] = header.clock
            self._push(identity, worker, header, payload)
        elif header.type == MsgType.SKIP:
            self._skip(identity, worker, header.clock)
        elif header.type == MsgType.DONE:
            if worker in self.cons.active:
                self.cons.finish(worker)
            self.done_identities[worker] = identity
            self._advance()
        else:
            self._refuse(identity, "unexpected_type", f"unexpected {header.type.name}")

    def _push(self, identity: bytes, worker: int, header: Any, payload: bytes) -> None:
        if worker not in self.cons.active:
            self._refuse(identity, "unexpected_type", f"worker {worker} pushed after DONE")
            return
        if self.first_push is None:
            self.first_push = time.monotonic()
        try:
            grad = decode_tensor(header, payload, self.param.dtype, self.param.numel())
            if not bool(torch.isfinite(grad).all()):
                raise ValueError("non_finite")
        except (ProtocolError, ValueError) as exc:
            reason = "non_finite" if str(exc) == "non_finite" else "wrong_dtype_or_size"
            self.rejected[reason] += 1
            self.cons.receive(worker, valid=False)  # its clock ticks; nothing is applied
        else:
            token = self.cons.receive(worker, valid=True)
            if token is not None:
                self.grads[token] = (grad, header.lr)
        self._advance()

    def _skip(self, identity: bytes, worker: int, step: int) -> None:
        """Worker ``worker`` skipped step ``step`` (fp16 overflow, agreed by all workers): the
        shard is already step ``step``'s, so a sync run checkpoints it under that label (once,
        before answering, as a round does) and the worker gets the unchanged weights."""
        first = all(self.steps[w] < step for w in self.cons.live)  # first worker to say so
        if first and self.on_round is not None and self.cons.mode == "sync":
            self.on_round(step)
        self.steps[worker] = max(self.steps[worker], step)
        self._send_weights(identity, worker)

    def _note_process(self, worker: int, payload: bytes) -> None:
        """Keep a heartbeat's ``HOST PID START`` when the worker runs on this host."""
        host, _, rest = payload[:256].decode("utf-8", "replace").partition(" ")
        pid, _, start = rest.partition(" ")
        if host == self._host and pid.isdigit() and start.isdigit():
            self.processes[worker] = (int(pid), start)

    def _gone(self, now: float) -> set[int]:
        """Active workers on this host whose process is gone (looked at every 0.2 s)."""
        if now - self._looked < 0.2:
            return set()
        self._looked = now
        return {w for w in self.cons.active if w in self.processes and ended(*self.processes[w])}

    def check_liveness(self) -> None:
        """Drop workers whose process is gone (not in sync mode), or silent for longer than
        ``worker_timeout`` (their heartbeat lapsed); sync mode: fail, naming the worker."""
        now = time.monotonic()
        # sync mode: a worker's death ends the job anyway, and the launcher names it best
        # (killed by which signal); the server's word would race it
        gone = set() if self.fail_on_loss else self._gone(now)
        for w in sorted(self.cons.active):
            silent = now - self.last_seen[w]
            if w in gone:
                why = "its process is gone"
            elif silent > self.worker_timeout:
                why = (
                    f"sent nothing for {silent:.1f} s (--ps-worker-timeout {self.worker_timeout:g})"
                )
            else:
                continue
            if self.fail_on_loss:
                raise PeerFailure(
                    f"parameter server {self.shard}: worker rank {w} {why}; sync mode cannot "
                    "go on without it",
                    rank=w,
                )
            self.cons.drop(w)
            self.dropped[w] = why
            self.lost.append(
                {
                    "worker": w,
                    "seconds": round(now - self.start, 3),
                    "clock": self.cons.clocks[w],
                    "version": self.cons.version,
                    "why": why,
                }
            )
            self._advance()

    def poll(self, timeout_ms: int = 100) -> None:
        """Handle every message that arrives within ``timeout_ms``, then check liveness."""
        if self.sock.poll(timeout_ms, zmq.POLLIN):
            while True:
                try:
                    frames = self.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                self.handle(frames)
        self.check_liveness()

    def run(self) -> dict[str, Any]:
        """Serve until every worker is done or lost; return the figures."""
        try:
            while not self.finished:
                self.poll()
        finally:
            self.sock.close(linger=5000)
        return self.figures()

    # --- checkpoints: the shard's state, saved and restored (apart from the protocol) ------
    def state_dict(self) -> dict[str, Any]:
        """The shard, its optimizer and the round clock: enough to resume a sync run exactly."""
        return {
            "param": self.param.detach().clone(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.cons.version,
            "received": self.cons.received,
            "budget": self.cons.budget,
            "clocks": [self.cons.clocks[w] for w in self.cons.workers],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (same shard bounds; any number of workers).

        Saved by another number of workers (a sync run resumed on M workers): the shard,
        its optimizer and the version (the step) are kept; every worker's clock is that
        version, ``received`` counts the version's steps at M gradients each, and the
        budget is this run's own (set at start from its worker count).
        """
        if state["param"].shape != self.param.shape:
            raise ValueError(f"parameter server {self.shard}: the checkpoint is of another shard")
        if len(state["clocks"]) != len(self.cons.workers):
            version = int(state["version"])
            n = len(self.cons.workers)
            state = {
                **state,
                "clocks": [version] * n,
                "received": version * n,
                "budget": self.cons.budget,
            }
        with torch.no_grad():
            self.param.copy_(state["param"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.cons.version = int(state["version"])
        self.cons.received = int(state["received"])
        self.cons.budget = int(state["budget"])
        for w, clock in zip(self.cons.workers, state["clocks"], strict=True):
            self.cons.clocks[w] = int(clock)
            self.cons.read_version[w] = self.cons.version

    def figures(self) -> dict[str, Any]:
        end = self.work_done_at or time.monotonic()
        return {
            "shard": self.shard,
            "rank": self.rank,
            "elements": self.param.numel(),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "messages_in": self.messages_in,
            "messages_out": self.messages_out,
            "rejected": dict(self.rejected),
            "lost_workers": self.lost,
            "train_seconds": round(end - self.first_push, 6) if self.first_push else 0.0,
            **self.cons.figures(),
        }
