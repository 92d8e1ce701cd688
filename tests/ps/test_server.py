"""One shard server in a thread, spoken to over real ZeroMQ sockets on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import zmq

from disttrain.comm.errors import PeerFailure
from disttrain.ps.client import PSClient
from disttrain.ps.consistency import Consistency
from disttrain.ps.protocol import MsgType, decode, decode_tensor, encode, encode_tensor
from disttrain.ps.server import ShardServer, bind_router

N = 8


class Running:
    """A server polled by a background thread until stopped."""

    def __init__(self, mode: str = "async", workers: int = 1, shard: int = 0, **kw: Any) -> None:
        sock, self.endpoint = bind_router()
        self.initial = torch.linspace(-1, 1, N)
        self.server = ShardServer(
            shard,
            self.initial,
            lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
            Consistency(mode, tuple(range(workers))),
            sock,
            **kw,
        )
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set() and not self.server.finished:
                self.server.poll(20)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        self.server.sock.close(linger=0)


@pytest.fixture
def server() -> Iterator[Running]:
    r = Running(worker_timeout=30.0)
    yield r
    r.stop()


def _dealer(endpoint: str, identity: bytes) -> zmq.Socket[Any]:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.IDENTITY, identity)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 10_000)
    s.connect(endpoint)
    return s


def _ask(s: zmq.Socket[Any], frames: list[Any]) -> tuple[Any, bytes]:
    s.send_multipart(frames)
    return decode(s.recv_multipart())


def _weights(s: zmq.Socket[Any]) -> torch.Tensor:
    header, payload = _ask(s, encode(MsgType.PULL, 0, 0, 0))
    assert header.type == MsgType.WEIGHTS
    return decode_tensor(header, payload, torch.float32, N)


def test_bad_frames_are_refused_counted_and_leave_the_state_unchanged(server: Running) -> None:
    w0 = _dealer(server.endpoint, b"w0")
    header, _ = _ask(w0, encode(MsgType.HELLO, 0, 0, 10))
    assert header.type == MsgType.WEIGHTS
    before = _weights(w0)
    assert torch.equal(before, server.initial)
    # broken framing and unknown peers get an ERROR reply
    for frames in ([b"garbage"], [b"\x00" * 32, b""]):
        assert _ask(w0, frames)[0].type == MsgType.ERROR
    stranger = _dealer(server.endpoint, b"intruder")  # not a worker: dropped without a reply
    stranger.setsockopt(zmq.RCVTIMEO, 500)
    with pytest.raises(zmq.Again):
        _ask(stranger, encode(MsgType.PULL, 0, 0, 0))
    # well-framed pushes with a bad payload: refused, the worker still gets the weights
    bad = [
        encode_tensor(MsgType.PUSH, 0, 0, 0, torch.ones(N, dtype=torch.float64)),
        encode_tensor(MsgType.PUSH, 0, 0, 0, torch.ones(N + 1)),
        encode_tensor(MsgType.PUSH, 0, 0, 0, torch.tensor([float("nan")] + [1.0] * (N - 1))),
        encode_tensor(MsgType.PUSH, 0, 0, 0, torch.tensor([float("inf")] + [1.0] * (N - 1))),
    ]
    for frames in bad:
        header, payload = _ask(w0, frames)
        assert header.type == MsgType.WEIGHTS
        assert torch.equal(decode_tensor(header, payload, torch.float32, N), before)
    assert torch.equal(_weights(w0), before)
    assert server.server.cons.version == 0
    assert server.server.optimizer.state == {} or all(
        not torch.any(s["momentum_buffer"]) for s in server.server.optimizer.state.values()
    )
    rejected = dict(server.server.rejected)
    assert rejected == {
        "malformed": 2,
        "unknown_worker": 1,
        "wrong_dtype_or_size": 2,
        "non_finite": 2,
    }
    # and a good gradient does change the weights: the checks above could fail
    header, payload = _ask(w0, encode_tensor(MsgType.PUSH, 0, 0, 0, torch.ones(N)))
    after = decode_tensor(header, payload, torch.float32, N)
    assert torch.allclose(after, before - 0.5)
    assert server.error is None


def test_client_push_pull_done_round_trip_with_two_servers() -> None:
    servers = [Running(shard=k, worker_timeout=30.0) for k in range(2)]
    try:
        client = PSClient(
            0,
            [s.endpoint for s in servers],
            [1, 2],
            [(0, N), (N, 2 * N)],
            torch.float32,
            timeout=10.0,
            heartbeat=0.1,
        )
        w = client.hello(steps=2)
        assert torch.equal(w, torch.cat([servers[0].initial, servers[1].initial]))
        w = client.push(torch.ones(2 * N))
        assert torch.allclose(w, torch.cat([s.initial for s in servers]) - 0.5)
        assert not client.stop
        client.push(torch.zeros(2 * N))
        assert client.stop  # budget: 2 steps x 1 worker
        final, stats = client.done(timeout=10.0)
        # a zero gradient still moves the weights by the momentum: 0.5 * (1 + 0.9)
        assert torch.allclose(final, torch.cat([s.initial for s in servers]) - 0.95)
        assert [s["shard"] for s in stats] == [0, 1] and all(s["received"] == 2 for s in stats)
        assert stats[0]["staleness_histogram"] == {"0": 2}
        client.close()
    finally:
        for s in servers:
            s.stop()


def test_a_silent_worker_is_dropped_in_async_and_fails_sync() -> None:
    lenient = Running("async", workers=2, worker_timeout=0.5)
    strict = Running("sync", workers=2, worker_timeout=0.5)
    try:
        beats = [_dealer(r.endpoint, b"h0") for r in (lenient, strict)]
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # worker 0 beats, worker 1 never says anything
            for hb in beats:
                hb.send_multipart(encode(MsgType.HEARTBEAT, 0, 0, 0))
            time.sleep(0.1)
        for hb in beats:
            hb.close()
        assert [entry["worker"] for entry in lenient.server.lost] == [1]
        assert lenient.error is None
        assert isinstance(strict.error, PeerFailure) and "worker rank 1" in str(strict.error)
    finally:
        lenient.stop()
        strict.stop()


def test_the_workers_scheduled_rate_and_staleness_lr_set_the_step(server: Running) -> None:
    w0 = _dealer(server.endpoint, b"w0")
    _ask(w0, encode(MsgType.HELLO, 0, 0, 10))
    header, payload = _ask(w0, encode_tensor(MsgType.PUSH, 0, 0, 0, torch.ones(N), lr=0.25))
    # SGD momentum 0.9, first step: w -= lr * g
    assert torch.allclose(decode_tensor(header, payload, torch.float32, N), server.initial - 0.25)
