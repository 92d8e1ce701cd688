"""Measure one emulated link: TCP goodput and round-trip time between two cluster hosts.

A receiver (``python -I linkprobe.py recv ADDR PORT``) runs in
the destination host's namespace and listens on that host's private address
only; a sender in the source host's namespace first bounces one byte 20 times
(round trip), then streams zeros. The receiver times the stream from its first
to its last byte, so connection set-up and the token bucket's initial burst
are (mostly) left out. This checks the shaping; it is no benchmark of our code.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the peers run this file as a plain script: standard library only
    from disttrain.cluster.hosts import Host

__all__ = ["LinkResult", "describe", "measure", "measure_duplex"]

PORT = 29399
PINGS = 20
_CHUNK = 256 * 1024


@dataclass(frozen=True)
class LinkResult:
    """What one transfer measured."""

    bytes: int
    seconds: float
    rtt_s: float

    @property
    def bits_per_s(self) -> float:
        return self.bytes * 8 / self.seconds


def _receive(addr: str, port: int) -> None:
    with socket.create_server((addr, port)) as srv:
        print("ready", flush=True)
        srv.settimeout(60)
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(120)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(PINGS):
                conn.sendall(conn.recv(1))
            first = conn.recv(_CHUNK)  # the clock starts when data starts arriving
            t0 = time.perf_counter()
            total = 0
            while chunk := conn.recv(_CHUNK):
                total += len(chunk)
            seconds = time.perf_counter() - t0
    print(json.dumps({"bytes": total, "seconds": seconds, "first": len(first)}), flush=True)


def _send(addr: str, port: int, nbytes: int) -> None:
    with socket.create_connection((addr, port), timeout=60) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(PINGS):
            t0 = time.perf_counter()
            conn.sendall(b"p")
            conn.recv(1)
            rtts.append(time.perf_counter() - t0)
        block = bytes(_CHUNK)
        sent = 0
        while sent < nbytes:
            conn.sendall(block)
            sent += len(block)
    print(json.dumps({"rtt": statistics.median(rtts)}), flush=True)


def _in(host: Host, *args: str) -> list[str]:
    # -I: run this file alone (no package import, so no torch start-up on each peer)
    return ["ip", "netns", "exec", host.ns, sys.executable, "-I", __file__, *args]


def measure(src: Host, dst: Host, rate_bits: int, seconds: float = 1.0) -> LinkResult:
    """Send about ``seconds`` worth of data at ``rate_bits`` from ``src`` to ``dst``."""
    nbytes = max(2 << 20, int(rate_bits / 8 * seconds))
    recv = subprocess.Popen(
        _in(dst, "recv", dst.address, str(PORT)), stdout=subprocess.PIPE, text=True
    )
    try:
        assert recv.stdout is not None
        if recv.stdout.readline().strip() != "ready":
            raise RuntimeError("link probe: the receiver did not start")
        sent = subprocess.run(
            _in(src, "send", dst.address, str(PORT), str(nbytes)),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        got = json.loads(recv.stdout.readline())
        recv.wait(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    return LinkResult(got["bytes"], got["seconds"], json.loads(sent.stdout)["rtt"])


def measure_duplex(a: Host, b: Host, rate_bits: int, seconds: float = 1.0) -> LinkResult:
    """Goodput from ``a`` to ``b`` while ``b`` sends to ``a`` at the same time: the slower
    direction. A ring's hosts send and receive at once, so a host's shaped egress also
    carries the ACKs of what it receives, which a one-way stream's idle reverse path hides
    (~2-3 % of the rate: 4 hosts at 100 Mbit/s, every ring step was under-predicted)."""
    nbytes = max(2 << 20, int(rate_bits / 8 * seconds))
    ends = [(b, PORT), (a, PORT + 1)]  # receivers: b hears a, a hears b
    recvs = [
        subprocess.Popen(_in(h, "recv", h.address, str(port)), stdout=subprocess.PIPE, text=True)
        for h, port in ends
    ]
    try:
        for r in recvs:
            assert r.stdout is not None
            if r.stdout.readline().strip() != "ready":
                raise RuntimeError("link probe: a receiver did not start")
        sends = [
            subprocess.Popen(
                _in(src, "send", dst.address, str(port), str(nbytes)),
                stdout=subprocess.PIPE,
                text=True,
            )
            for src, (dst, port) in ((a, ends[0]), (b, ends[1]))
        ]
        outs = [s.communicate(timeout=120)[0] for s in sends]
        got = [json.loads(r.stdout.readline()) for r in recvs if r.stdout is not None]
        for r in recvs:
            r.wait(timeout=30)
    finally:
        for r in recvs:
            if r.poll() is None:
                r.kill()
                r.wait()
    slower = min(got, key=lambda g: g["bytes"] / g["seconds"])
    return LinkResult(slower["bytes"], slower["seconds"], json.loads(outs[0])["rtt"])


def describe(result: LinkResult, rate_bits: int) -> str:
    """One line: measured goodput against the shaped rate, and the round trip."""
    from disttrain.cluster.netns import format_rate

    return (
        f"{result.bytes / 1e6:.1f} MB in {result.seconds:.3f} s: "
        f"{result.bits_per_s / 1e6:.1f} Mbit/s of TCP goodput on a {format_rate(rate_bits)} link "
        f"({result.bits_per_s / rate_bits:.0%}); round trip {result.rtt_s * 1e6:.0f} us"
    )


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        _receive(sys.argv[2], int(sys.argv[3]))
    else:
        _send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
