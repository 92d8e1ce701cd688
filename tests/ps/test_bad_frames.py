"""Bad wire frames go to a real shard server over ZeroMQ: each is refused and leaves the
server's weights, version and optimizer state unchanged (docs/errors.md, with the CLI's
bad-input matrix of tests/test_bad_inputs.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq

from tests.ps.test_server import N, Running, _dealer


# --- wire frames ------------------------------------------------------------------------
def _header(raw: bytes, at: int, value: bytes) -> bytes:
    return raw[:at] + value + raw[at + len(value) :]


def _push(worker: int = 0, shard: int = 0) -> list[bytes]:
    from disttrain.ps.protocol import MsgType, encode_tensor

    return [bytes(f) for f in encode_tensor(MsgType.PUSH, shard, worker, 0, torch.ones(N))]


FRAMES: list[tuple[str, bytes, Callable[[], list[bytes]], str]] = [
    # (id, sender identity, frames, the rejection counter that must move)
    ("one-frame", b"w0", lambda: [b"garbage"], "malformed"),
    ("three-frames", b"w0", lambda: [*_push(), b"extra"], "malformed"),
    ("short-header", b"w0", lambda: [_push()[0][:20], _push()[1]], "malformed"),
    ("bad-magic", b"w0", lambda: [_header(_push()[0], 0, b"XX"), _push()[1]], "malformed"),
    ("bad-version", b"w0", lambda: [_header(_push()[0], 2, b"\x07"), _push()[1]], "malformed"),
    ("unknown-op", b"w0", lambda: [_header(_push()[0], 3, b"\x63"), _push()[1]], "malformed"),
    ("unknown-dtype", b"w0", lambda: [_header(_push()[0], 5, b"\x63"), _push()[1]], "malformed"),
    ("wrong-length", b"w0", lambda: [_push()[0], _push()[1][:-4]], "malformed"),
    (
        "nan-lr",
        b"w0",
        lambda: [_header(_push()[0], 28, b"\x00\x00\xc0\x7f"), _push()[1]],
        "malformed",
    ),
    ("unknown-peer", b"intruder", _push, "unknown_worker"),
    ("unknown-worker-index", b"w7", lambda: _push(worker=7), "unknown_worker"),
    ("spoofed-worker-field", b"w0", lambda: _push(worker=1), "unknown_worker"),
    ("wrong-shard", b"w0", lambda: _push(shard=3), "wrong_shard"),
]


@pytest.fixture(scope="module")
def shard_server() -> Any:
    r = Running("async", workers=2, worker_timeout=60.0)
    yield r
    for sock in _SOCKETS.values():
        sock.close()
    _SOCKETS.clear()
    r.stop()


@pytest.mark.parametrize(
    ("identity", "frames", "counter"), [f[1:] for f in FRAMES], ids=[f[0] for f in FRAMES]
)
def test_a_bad_frame_is_refused_and_changes_nothing(
    identity: bytes, frames: Callable[[], list[bytes]], counter: str, shard_server: Running
) -> None:
    from disttrain.ps.protocol import MsgType, decode

    server = shard_server.server
    probe = _socket(shard_server, b"w1")
    before = _pull(probe, 1)
    version, counts = server.cons.version, dict(server.rejected)
    sender = _socket(shard_server, identity)
    sender.send_multipart(frames())
    if identity in (b"w0", b"w1"):  # a known worker is told why, so it fails fast
        header, payload = decode(sender.recv_multipart())
        assert header.type == MsgType.ERROR and payload, payload
    else:  # a stranger is told nothing at all
        deadline = time.monotonic() + 10
        while server.rejected[counter] == counts.get(counter, 0) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not sender.poll(300, zmq.POLLIN)
    assert torch.equal(_pull(probe, 1), before)
    assert server.cons.version == version and server.optimizer.state == {}
    assert server.rejected[counter] == counts.get(counter, 0) + 1
    assert shard_server.error is None


_SOCKETS: dict[bytes, zmq.Socket[Any]] = {}


def _socket(running: Running, identity: bytes) -> zmq.Socket[Any]:
    """One socket per identity for the whole module: a ROUTER keeps routing an identity to
    its first connection, so a second socket of the same name would not get the replies."""
    if identity not in _SOCKETS:
        _SOCKETS[identity] = _dealer(running.endpoint, identity)
    return _SOCKETS[identity]


def _pull(sock: zmq.Socket[Any], worker: int) -> torch.Tensor:
    from disttrain.ps.protocol import MsgType, decode, decode_tensor, encode

    sock.send_multipart(encode(MsgType.PULL, 0, worker, 0))
    header, payload = decode(sock.recv_multipart())
    assert header.type == MsgType.WEIGHTS
    return decode_tensor(header, payload, torch.float32, N)


def test_every_frame_case_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    missing = [cid for cid, *_ in FRAMES if f"| `{cid}` |" not in doc]
    assert not missing, f"docs/errors.md lacks the cases {missing}"
