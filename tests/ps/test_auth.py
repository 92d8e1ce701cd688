"""CURVE on the parameter server's sockets: the right key talks, a wrong or missing one never
reaches the server and the worker fails within its timeout with a message naming the key."""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import zmq

from disttrain.comm.errors import PeerFailure, UsageError
from disttrain.ps import auth
from disttrain.ps.client import PSClient
from disttrain.ps.consistency import Consistency
from disttrain.ps.server import ShardServer, bind_router

N = 8


def test_pinned_pyzmq_has_curve() -> None:
    assert zmq.has("curve"), f"pyzmq {zmq.__version__} / libzmq {zmq.zmq_version()}"


def test_key_file_round_trip_and_refusals(tmp_path: Path) -> None:
    key = auth.write_key(str(tmp_path / "k"))
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600
    assert auth.read_key(str(tmp_path / "k")) == key
    assert key.public == zmq.curve_public(key.secret)
    with pytest.raises(FileExistsError):
        auth.write_key(str(tmp_path / "k"))  # never overwrite a key
    with pytest.raises(UsageError, match="cannot read"):
        auth.read_key(str(tmp_path / "missing"))
    (tmp_path / "short").write_bytes(b"abc\n")
    with pytest.raises(UsageError, match="not a CURVE secret key"):
        auth.read_key(str(tmp_path / "short"))


class CurveServer:
    """A shard server with CURVE on, polled by a thread."""

    def __init__(self, key: auth.CurveKey) -> None:
        sock, self.endpoint = bind_router(curve=key)
        self.server = ShardServer(
            0,
            torch.zeros(N),
            lambda p: torch.optim.SGD(p, lr=1.0),
            Consistency("async", (0,)),
            sock,
            worker_timeout=60.0,
        )
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.server.finished:
            self.server.poll(20)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        self.server.sock.close(linger=0)


@pytest.fixture
def key(tmp_path: Path) -> auth.CurveKey:
    return auth.write_key(str(tmp_path / "job.key"))


@pytest.fixture
def server(key: auth.CurveKey) -> Iterator[CurveServer]:
    s = CurveServer(key)
    yield s
    s.stop()


def _client(server: CurveServer, curve: auth.CurveKey | None, timeout: float) -> PSClient:
    return PSClient(0, [server.endpoint], [1], [(0, N)], torch.float32, timeout, 0.1, curve)


def test_the_jobs_key_talks_to_a_curve_server(server: CurveServer, key: auth.CurveKey) -> None:
    client = _client(server, key, timeout=20.0)
    try:
        assert torch.equal(client.hello(steps=5), torch.zeros(N))
        assert torch.equal(client.push(torch.ones(N)), -torch.ones(N))
        assert server.server.messages_in >= 2
    finally:
        client.close()


@pytest.mark.parametrize("who", ["wrong-key", "no-key"])
def test_a_wrong_or_missing_key_never_reaches_the_server(
    server: CurveServer, tmp_path: Path, who: str
) -> None:
    curve = auth.write_key(str(tmp_path / "other.key")) if who == "wrong-key" else None
    client = _client(server, curve, timeout=2.0)
    start = time.monotonic()
    try:
        with pytest.raises(PeerFailure, match=r"parameter server 0 .* within 2 s") as info:
            client.hello(steps=5)
    finally:
        client.close()
    assert time.monotonic() - start < 2.0 + 5.0  # the timeout, not a hang
    if who == "wrong-key":
        assert "--ps-curve-key" in str(info.value)
    time.sleep(0.5)  # heartbeats went out every 0.1 s: none may have arrived either
    assert server.server.messages_in == 0
    assert dict(server.server.rejected) == {}


def test_keygen_writes_a_key_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from disttrain.ps import keygen

    path = str(tmp_path / "k")
    assert keygen.main([path]) == 0
    assert auth.read_key(path).public
    assert keygen.main([path]) == 2  # an existing key is never overwritten
    assert "cannot write" in capsys.readouterr().err
