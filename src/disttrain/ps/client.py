"""A worker's side of the parameter servers: push gradients, pull weights, shard by shard.

One DEALER socket per server carries requests; the requests to all shards go
out before any reply is awaited, so the K servers work in parallel. A
background thread sends a heartbeat to every server on sockets of its own
(ZeroMQ sockets are not thread-safe), so that a worker held by SSP or busy in
a long backward is not mistaken for a dead one; each beat carries ``HOST PID
START`` of the worker's process, so that a server on the same host sees it gone
at once. A server that does not answer within ``timeout`` seconds ends the worker
with an error naming it; one that dropped this worker as lost (its heartbeat
lapsed: a process stopped past ``--ps-worker-timeout`` and resumed) refuses it for
good, and the worker stops with :class:`~disttrain.comm.errors.LeftOut`, lost
like the others, not failing the job.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from disttrain.comm.errors import LeftOut, PeerFailure
from disttrain.comm.meter import record_send
from disttrain.comm.procstat import start_time
from disttrain.ps.auth import CurveKey, secure_client
from disttrain.ps.protocol import (
    FLAG_DROPPED,
    FLAG_STOP,
    HEADER,
    Header,
    MsgType,
    ProtocolError,
    decode,
    decode_tensor,
    encode,
    encode_tensor,
)

__all__ = ["Heartbeat", "PSClient"]

_HANDSHAKE_EVENTS = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class Heartbeat(threading.Thread):
    """Sends a HEARTBEAT to every server every ``interval`` seconds until stopped."""

    def __init__(
        self, worker: int, endpoints: list[str], interval: float, curve: CurveKey | None = None
    ) -> None:
        super().__init__(name=f"ps-heartbeat-w{worker}", daemon=True)
        self.worker = worker
        self.curve = curve
        self.endpoints = endpoints
        self.interval = interval
        self.sent = [0] * len(endpoints)  # bytes per server, metered when the thread ends
        self._stop_event = threading.Event()

    def run(self) -> None:
        ctx = zmq.Context.instance()
        me = os.getpid()
        process = f"{socket.gethostname()} {me} {start_time(me)}".encode()
        socks = []
        for ep in self.endpoints:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, f"h{self.worker}".encode())
            s.setsockopt(zmq.LINGER, 0)
            if self.curve is not None:
                secure_client(s, self.curve)
            s.connect(ep)
            socks.append(s)
        try:
            while not self._stop_event.is_set():
                for k, s in enumerate(socks):
                    beat = encode(MsgType.HEARTBEAT, k, self.worker, 0, process)
                    try:  # never block: with no connection (yet, or refused), skip this beat
                        s.send_multipart(beat, zmq.NOBLOCK)
                    except zmq.Again:
                        continue
                    self.sent[k] += HEADER.size + len(process)
                self._stop_event.wait(self.interval)
        finally:
            for s in socks:
                s.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


class PSClient:
    """Worker ``worker``'s connection to the servers at ``endpoints`` (global ranks ``ranks``)."""

    def __init__(
        self,
        worker: int,
        endpoints: list[str],
        ranks: list[int],
        bounds: list[tuple[int, int]],
        dtype: torch.dtype,
        timeout: float,
        heartbeat: float,
        curve: CurveKey | None = None,
    ) -> None:
        self.worker = worker
        self.ranks = ranks
        self.bounds = bounds
        self.dtype = dtype
        self.timeout = timeout
        self.clock = 0
        self.stop = False
        ctx = zmq.Context.instance()
        self.socks: list[zmq.Socket[Any]] = []
        self.monitors: list[zmq.Socket[Any]] = []
        self.handshaken: set[int] = set()
        for ep in endpoints:
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.IDENTITY, f"w{worker}".encode())
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDTIMEO, max(1, int(timeout * 1000)))
            if curve is not None:
                secure_client(s, curve)
                # to tell "wrong key" from "server silent" when no answer comes
                self.monitors.append(s.get_monitor_socket(_HANDSHAKE_EVENTS))
            s.connect(ep)
            self.socks.append(s)
        self.heartbeat = Heartbeat(worker, endpoints, heartbeat, curve)
        self.heartbeat.start()

    @property
    def numel(self) -> int:
        return self.bounds[-1][1]

    def _send(self, k: int, frames: list[bytes | memoryview]) -> None:
        try:  # SNDTIMEO: a server never connected (down, or refusing our key) is not a hang
            self.socks[k].send_multipart(frames)
        except zmq.Again:
            raise PeerFailure(self._silent(k, "could not send to"), rank=self.ranks[k]) from None
        record_send(self.ranks[k], sum(memoryview(f).nbytes for f in frames))

    def _recv(self, k: int, deadline: float) -> tuple[Header, bytes]:
        sock = self.socks[k]
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not sock.poll(int(remaining * 1000), zmq.POLLIN):
            raise PeerFailure(self._silent(k, "did not answer"), rank=self.ranks[k])
        try:
            header, payload = decode(sock.recv_multipart())
        except ProtocolError as exc:
            msg = f"parameter server {k} broke the protocol: {exc}"
            raise PeerFailure(msg, self.ranks[k]) from None
        if header.type == MsgType.ERROR and header.flags & FLAG_DROPPED:
            raise LeftOut(
                f"parameter server {k} dropped worker {self.worker} as lost "
                f"({payload.decode()}) and does not take it back: the other workers go on"
            )
        if header.type == MsgType.ERROR:
            raise PeerFailure(
                f"parameter server {k} refused worker {self.worker}: {payload.decode()}",
                rank=self.ranks[k],
            )
        return header, payload

    def _silent(self, k: int, what: str) -> str:
        why = ""
        if self.monitors and not self._handshake_succeeded(k):
            why = (
                ": no CURVE handshake succeeded; every process of the job must use the "
                "same --ps-curve-key file"
            )
        if what == "could not send to":
            return (
                f"worker {self.worker} could not send to parameter server {k} "
                f"(rank {self.ranks[k]}) within {self.timeout:.0f} s{why}"
            )
        return (
            f"parameter server {k} (rank {self.ranks[k]}) did not answer worker "
            f"{self.worker} within {self.timeout:.0f} s{why}"
        )

    def _handshake_succeeded(self, k: int) -> bool:
        """Whether socket ``k`` ever completed a CURVE handshake (read from its monitor)."""
        mon = self.monitors[k]
        while mon.poll(0, zmq.POLLIN):
            event = recv_monitor_message(mon)
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.handshaken.add(k)
        return k in self.handshaken

    def _gather_weights(self, out: torch.Tensor, deadline: float) -> None:
        """Read one WEIGHTS reply from every server into ``out``."""
        stop = False
        for k, (lo, hi) in enumerate(self.bounds):
            header, payload = self._recv(k, deadline)
            if header.type != MsgType.WEIGHTS:
                raise PeerFailure(f"parameter server {k} sent {header.type.name}, not WEIGHTS")
            try:
                out[lo:hi] = decode_tensor(header, payload, self.dtype, hi - lo)
            except ProtocolError as exc:
                raise PeerFailure(f"parameter server {k}: {exc}", rank=self.ranks[k]) from None
            stop = stop or bool(header.flags & FLAG_STOP)
        self.stop = self.stop or stop

    def _request(self, kind: MsgType, clock: int) -> torch.Tensor:
        for k in range(len(self.socks)):
            self._send(k, encode(kind, k, self.worker, clock))
        out = torch.empty(self.numel, dtype=self.dtype)
        self._gather_weights(out, time.monotonic() + self.timeout)
        return out

    def hello(self, steps: int) -> torch.Tensor:
        """Join a run of ``steps`` steps per worker; return the current weights (flat).

        The servers make ``steps`` x workers gradients the job's work budget.
        """
        return self._request(MsgType.HELLO, steps)

    def pull(self) -> torch.Tensor:
        return self._request(MsgType.PULL, self.clock)

    def push(self, grad: torch.Tensor, lr: float = 0.0, step: int = 0) -> torch.Tensor:
        """Send a flat gradient shard by shard; return the weights the servers answer with.

        The answer may be held by the servers (sync, ssp), so the deadline is
        the timeout. ``self.stop`` turns true when the job's work is done. ``lr`` is the
        rate the worker's schedule gives this step (0: the servers' own). ``step`` is the
        worker's step number, the label of the servers' checkpoints of this round (0: the
        pushes so far, this one included).
        """
        grad = grad.detach().to("cpu", self.dtype).contiguous()  # the wire is host memory (zmq)
        label = step or self.clock + 1
        for k, (lo, hi) in enumerate(self.bounds):
            frames = encode_tensor(MsgType.PUSH, k, self.worker, label, grad[lo:hi], lr=lr)
            self._send(k, frames)
        self.clock += 1
        out = torch.empty(self.numel, dtype=self.dtype)
        self._gather_weights(out, time.monotonic() + self.timeout)
        return out

    def skip(self, step: int) -> torch.Tensor:
        """Tell the servers this worker skipped step ``step`` (nothing to apply), so that they
        label their checkpoints by the workers' steps; return the (unchanged) weights."""
        return self._request(MsgType.SKIP, step)

    def done(self, timeout: float) -> tuple[torch.Tensor, list[dict[str, Any]]]:
        """Say this worker is finished; wait (up to ``timeout``) until all are, and return
        the final weights and every server's figures."""
        for k in range(len(self.socks)):
            self._send(k, encode(MsgType.DONE, k, self.worker, self.clock))
        deadline = time.monotonic() + timeout
        out = torch.empty(self.numel, dtype=self.dtype)
        self._gather_weights(out, deadline)
        stats = []
        for k in range(len(self.socks)):
            header, payload = self._recv(k, deadline)
            if header.type != MsgType.STATS:
                raise PeerFailure(f"parameter server {k} sent {header.type.name}, not STATS")
            stats.append(json.loads(payload.decode()))
        return out, stats

    def close(self) -> None:
        """Stop the heartbeat, meter its bytes, and close the sockets."""
        if self.heartbeat.is_alive():
            self.heartbeat.stop()
            for k, nbytes in enumerate(self.heartbeat.sent):
                if nbytes:
                    record_send(self.ranks[k], nbytes, messages=nbytes // HEADER.size)
        for s in self.socks:
            if self.monitors:
                s.disable_monitor()
            s.close()
        for m in self.monitors:
            m.close()
        self.socks, self.monitors = [], []
