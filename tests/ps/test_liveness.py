"""The parameter server's view of its workers (issue 51): a worker whose process is gone is
dropped at once (its heartbeats name the process), not after ``--ps-worker-timeout``; one
that heartbeats is kept however slow; one dropped that speaks again (a SIGSTOPped worker
resumed) is refused for good, and its client stops with LeftOut (lost, not failing the
job) instead of a peer failure."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest
import torch

from disttrain.comm.errors import LeftOut
from disttrain.comm.procstat import start_time
from disttrain.ps.client import PSClient
from disttrain.ps.protocol import FLAG_DROPPED, MsgType, decode, encode
from tests.ps.test_server import N, Running, _dealer


def _beat(pid: int, start: str) -> list[bytes | memoryview]:
    return encode(MsgType.HEARTBEAT, 0, 1, 0, f"{socket.gethostname()} {pid} {start}".encode())


def test_a_worker_whose_process_is_gone_is_dropped_at_once_and_a_beating_one_kept() -> None:
    running = Running("async", workers=3, worker_timeout=30.0)
    child = subprocess.Popen(["sleep", "60"])
    try:
        start = start_time(child.pid)
        assert start
        beats = {w: _dealer(running.endpoint, f"h{w}".encode()) for w in (0, 1)}
        me = start_time(os.getpid())
        beats[0].send_multipart(
            encode(
                MsgType.HEARTBEAT, 0, 0, 0, f"{socket.gethostname()} {os.getpid()} {me}".encode()
            )
        )
        beats[1].send_multipart(_beat(child.pid, start))
        time.sleep(0.5)
        assert running.server.lost == []  # both alive; worker 2 silent, within 30 s
        child.kill()
        child.wait()
        deadline = time.monotonic() + 5.0  # far below the 30 s of silence it would take
        while not running.server.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(e["worker"], e["why"]) for e in running.server.lost] == [
            (1, "its process is gone")
        ]
        assert running.error is None
        for s in beats.values():
            s.close()
    finally:
        child.kill()
        child.wait()
        running.stop()


@pytest.mark.timeout(60)
def test_a_dropped_worker_that_speaks_again_is_refused_for_good() -> None:
    running = Running("async", workers=3, worker_timeout=0.5)
    try:
        beat = _dealer(running.endpoint, b"h0")
        deadline = time.monotonic() + 3.0
        while len(running.server.lost) < 2 and time.monotonic() < deadline:
            beat.send_multipart(encode(MsgType.HEARTBEAT, 0, 0, 0))  # 1 and 2 say nothing
            time.sleep(0.1)
        assert [e["worker"] for e in running.server.lost] == [1, 2]
        assert running.server.lost[0]["why"].startswith("sent nothing for")
        # its request, raw: an ERROR flagged as a drop, saying why
        w1 = _dealer(running.endpoint, b"w1")
        w1.send_multipart(encode(MsgType.PULL, 0, 1, 0))
        header, payload = decode(w1.recv_multipart())
        assert header.type == MsgType.ERROR and header.flags & FLAG_DROPPED
        assert payload.decode().startswith("worker 1 was dropped as lost: sent nothing for")
        w1.close()
        # through the client: LeftOut (the worker is lost, like the others), not PeerFailure
        client = PSClient(2, [running.endpoint], [1], [(0, N)], torch.float32, 10.0, 0.1)
        with pytest.raises(LeftOut, match="dropped worker 2 as lost"):
            client.hello(steps=2)
        client.close()
        beat.close()
    finally:
        running.stop()
