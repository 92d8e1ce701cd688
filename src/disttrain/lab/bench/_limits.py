"""The host's physical limits for one-host collectives, measured in the benchmark's own run.

Two figures bound what an allreduce between ranks of one host can reach:

- single-thread memory copy (GB/s): ``torch`` copying a 64 MiB buffer into another
  (one thread, as every rank runs), median of 5 after a warm-up; a shared-memory
  allreduce moves each byte at least twice through memory (in and out).
- loopback TCP (GB/s): one 64 MiB stream from a thread of this process to another over
  a TCP connection on 127.0.0.1 (the path gloo takes between ranks of one host), median
  of 3; nothing listens beyond 127.0.0.1 and the socket is closed at once.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

import torch

__all__ = ["loopback_tcp_GBps", "memcpy_GBps"]


def memcpy_GBps(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """Single-thread memory-copy bandwidth: bytes copied per second (GB/s, 1e9)."""
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9


def loopback_tcp_GBps(nbytes: int = 64 << 20, repeats: int = 3) -> float:
    """Loopback TCP bandwidth of one stream (GB/s, 1e9)."""
    payload = memoryview(bytearray(1 << 20))
    sink = bytearray(1 << 20)
    times = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname()) as out:
            conn, _ = server.accept()
            server.close()
            with conn:
                for _ in range(repeats):

                    def send() -> None:
                        left = nbytes
                        while left > 0:
                            left -= out.send(payload[: min(left, len(payload))])

                    sender = threading.Thread(target=send)
                    start = time.perf_counter()
                    sender.start()
                    got = 0
                    while got < nbytes:
                        got += conn.recv_into(sink)
                    sender.join()
                    times.append(time.perf_counter() - start)
    return nbytes / statistics.median(times) / 1e9
