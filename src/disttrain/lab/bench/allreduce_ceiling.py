"""The physical ceiling under bench allreduce: loopback TCP and memory-copy bandwidth.

    disttrain bench allreduce-ceiling [--repeats 5]

Loopback TCP: one sender thread writes 1 MB blocks to a socket on 127.0.0.1,
the main thread reads them into one buffer (``recv_into``, no Python copies);
reported as GB/s of payload. Memory copy: ``torch.Tensor.copy_`` of 64 MB
between two preallocated buffers on one thread (GB/s copied; the memory bus
moves twice that). Medians of repeated runs, because the machine is shared.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time

from disttrain.comm.errors import UsageError

__all__ = ["add_arguments", "loopback_tcp_gbps", "memcpy_gbps", "run"]


def loopback_tcp_gbps(total: int = 256 << 20, block: int = 1 << 20) -> float:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    payload = bytes(block)

    def sender() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            for _ in range(total // block):
                s.sendall(payload)

    thread = threading.Thread(target=sender)
    thread.start()
    conn, _ = server.accept()
    buf = memoryview(bytearray(block))
    got = 0
    start = time.perf_counter()
    while got < total:
        n = conn.recv_into(buf)
        if n == 0:
            break
        got += n
    elapsed = time.perf_counter() - start
    thread.join()
    conn.close()
    server.close()
    return got / elapsed / 1e9


def memcpy_gbps(nbytes: int = 64 << 20, reps: int = 10) -> float:
    import torch

    torch.set_num_threads(1)
    a = torch.ones(nbytes // 4)
    b = torch.empty_like(a)
    b.copy_(a)
    start = time.perf_counter()
    for _ in range(reps):
        b.copy_(a)
    return nbytes * reps / (time.perf_counter() - start) / 1e9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=5, help="runs of each (default: 5)")


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats}: use at least 1")
    tcp = [loopback_tcp_gbps() for _ in range(args.repeats)]
    mem = [memcpy_gbps() for _ in range(args.repeats)]
    print(
        f"loopback TCP, one stream, 1 MB blocks: median {statistics.median(tcp):.2f} GB/s "
        f"(runs: {', '.join(f'{x:.2f}' for x in tcp)})"
    )
    print(
        f"memory copy, 64 MB, one thread:       median {statistics.median(mem):.2f} GB/s "
        f"(runs: {', '.join(f'{x:.2f}' for x in mem)})"
    )
    return 0
