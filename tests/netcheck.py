"""Which processes of a tree live and which addresses they listen on, from /proc (Linux only).

A pid alone does not name a process for long: this machine's ``pid_max`` is 32768 and
the suite's processes and threads (they share the numbers) wrap it within minutes, so a
pid recorded before a job ended may belong to another test's rank a few seconds later.
A test that then killed "what is left" killed that rank (a CI run lost one so:
"Connection reset by peer" in tests/collectives/test_base.py). :func:`descendants`
therefore returns :class:`Proc`, a pid that remembers its process's start time;
:func:`alive` and :func:`kill` act on that process only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

__all__ = ["Proc", "Tree", "alive", "descendants", "kill", "listening_addresses", "started"]


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


class Proc(int):
    """A pid, and its process's start time (clock ticks after boot, stat field 22): the two
    together name one process for good. It is an ``int`` (the pid) everywhere else."""

    start: int

    def __new__(cls, pid: int, start: int) -> Proc:
        self = super().__new__(cls, pid)
        self.start = start
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Proc):  # a reused pid is another process
            return int(self) == int(other) and self.start == other.start
        return int(self) == other

    __hash__ = int.__hash__

    def __repr__(self) -> str:
        return str(int(self))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not); for a
    :class:`Proc`, whether that very process runs (not a later one with its pid)."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return False
    return not isinstance(pid, Proc) or int(fields[19]) == pid.start


def kill(proc: Proc, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``proc`` if that very process still runs. Through a pidfd: once
    opened it names the process it found, so a pid freed and reused after the identity
    check cannot receive the signal."""
    try:
        fd = os.pidfd_open(proc)
    except ProcessLookupError:
        return
    try:
        if alive(proc):
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, sig)
    finally:
        os.close(fd)


def descendants(pid: int) -> list[Proc]:
    """``pid`` and all its live descendants."""
    children: dict[int, list[Proc]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None:
            continue
        children.setdefault(int(fields[1]), []).append(Proc(int(entry), int(fields[19])))
    root = _stat(pid)
    out: list[Proc] = []
    todo = [Proc(pid, int(root[19]) if root else -1)]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class Tree:
    """Every process that was ever under ``root``, polled from /proc: a poll reads the
    stat file of the pids it has not seen before only (a process's parent is the one it
    was born to until it is orphaned, and one seen in the tree stays in it), so it costs
    the job's new processes, not the host's: the full scan :func:`descendants` makes
    (about 4 ms) 10 times a second was a quarter of a fault case's CPU (test_faults)."""

    def __init__(self, root: int) -> None:
        self.parent: dict[int, int] = {}  # pid -> its parent when first seen (-1: gone)
        fields = _stat(root)
        self.members: set[Proc] = {Proc(root, int(fields[19]) if fields else -1)}
        self._in = {root}

    def poll(self) -> set[Proc]:
        entries = {int(e) for e in os.listdir("/proc") if e.isdigit()}
        for gone in self.parent.keys() - entries:  # a pid used again is read again
            del self.parent[gone]
        new: dict[int, list[str]] = {}
        for pid in entries - self.parent.keys():
            fields = _stat(pid)
            self.parent[pid] = int(fields[1]) if fields else -1
            if fields:
                new[pid] = fields
        grew = True
        while grew:  # a child and its own child new in one poll, in any pid order
            grew = False
            for pid, fields in list(new.items()):
                if self.parent[pid] in self._in:
                    self._in.add(pid)
                    self.members.add(Proc(pid, int(fields[19])))
                    del new[pid]
                    grew = True
        return self.members


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


@contextlib.contextmanager
def started(cmd: list[str], **popen: Any) -> Iterator[tuple[subprocess.Popen[str], list[Proc]]]:
    """``cmd`` started (stdout dropped, stderr kept as text; ``popen``: Popen's other
    keywords) and a list for the processes the test records of its tree: at the end, those
    and whatever still descends from it are SIGKILLed, whatever failed (a process the test
    recorded was re-parented once its parent died, so the tree alone would miss it)."""
    proc = subprocess.Popen(
        cmd, **{"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True, **popen}
    )
    tree: list[Proc] = []
    try:
        yield proc, tree
    finally:
        for p in [*descendants(proc.pid)[::-1], *tree]:
            kill(p)
        proc.wait()
