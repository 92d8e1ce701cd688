"""A stray dialler: connects to gloo listeners and sends small sequence numbers, as a pair
of a dying group does when its connect lands on a port the OS has given to a new listener.

gloo's listener hands a connection to the pair that waits for the sequence number in its
first 8 bytes; a stray that sends each number 0 .. N-1 and closes takes the place of
whichever pair of that listener waits for a peer that has not connected yet (issue 51).
Listeners are found in ``/proc``: a process's sockets (``/proc/PID/fd``) among the host's
listening TCP sockets (``/proc/net/tcp``, ``tcp6``). Linux only, as the tests are.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

#: a TCP socket's state in /proc/net/tcp: listening
_LISTEN = "0A"


def listeners(pid: int) -> set[tuple[str, int]]:
    """The (host, port) of each TCP socket process ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # a descriptor closed meanwhile
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)  # the heading
            for line in f:
                fields = line.split()
                if fields[3] == _LISTEN and fields[9] in inodes:
                    found.add(_address(fields[1], family))
    return found


def _address(text: str, family: int) -> tuple[str, int]:
    """``0100007F:9C41`` (the host's bytes in kernel order, the port in hex) as
    ``("127.0.0.1", 40001)``; a wildcard address as the loopback one."""
    raw, port = text.split(":")
    packed = b"".join(bytes.fromhex(raw[i : i + 8])[::-1] for i in range(0, len(raw), 8))
    host = socket.inet_ntop(family, packed)
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if family == socket.AF_INET else "::1"
    return host, int(port, 16)


def dial(host: str, port: int, seqs: range) -> None:
    """One connection per sequence number: its 8 bytes, then closed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for seq in seqs:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(2.0)
            sock.connect((host, port))
            sock.sendall(seq.to_bytes(8, "little", signed=True))


def dial_new_listeners(
    pids: list[int], before: dict[int, set[tuple[str, int]]], seqs: range, wait: float = 10.0
) -> int:
    """Wait until each process in ``pids`` listens on a port it did not in ``before``,
    then dial each such listener with every number in ``seqs``; the listeners dialled."""
    deadline = time.monotonic() + wait
    fresh: dict[int, set[tuple[str, int]]] = {}
    while len(fresh) < len(pids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no new listener in {sorted(set(pids) - set(fresh))}")
        for pid in pids:
            new = listeners(pid) - before[pid]
            if new:
                fresh[pid] = new
        time.sleep(0.005)
    for new in fresh.values():
        for host, port in new:
            dial(host, port, seqs)
    return sum(len(new) for new in fresh.values())
