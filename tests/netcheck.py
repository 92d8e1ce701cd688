"""Which processes of a tree live and which addresses they listen on, from /proc (Linux only)."""

from __future__ import annotations

import os
import socket

__all__ = ["alive", "descendants", "listening_addresses"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    return inodes


def _decode(hex_addr: str, family: int) -> str:
    raw = bytes.fromhex(hex_addr)
    if family == socket.AF_INET:
        return socket.inet_ntop(family, raw[::-1])
    # /proc/net/tcp6 stores four little-endian 32-bit words
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(family, words)


def listening_addresses(pids: list[int], proc_net: str = "/proc/net") -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state owned by ``pids``.

    ``proc_net`` is read for the socket tables: ``/proc/PID/net`` for processes
    in another network namespace (PID being one of them).
    """
    inodes = _socket_inodes(pids)
    found = []
    tables = ((f"{proc_net}/tcp", socket.AF_INET), (f"{proc_net}/tcp6", socket.AF_INET6))
    for path, family in tables:
        try:
            with open(path) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A = LISTEN
                addr, port = fields[1].split(":")
                found.append((_decode(addr, family), int(port, 16)))
    return found
