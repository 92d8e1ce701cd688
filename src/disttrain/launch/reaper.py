"""A watchdog that ends a launcher's whole process tree when the launcher dies, for
trees the kernel's tether (:mod:`tether`) cannot reach.

``--launcher ray`` starts a local Ray: its GCS, raylet and the raylet's own children
(the dashboard and runtime-env agents, the Train workers). Those are Ray's to start, so
no ``PR_SET_PDEATHSIG`` reaches them, and after a SIGKILL of the launcher the two
agents were still running a minute later (their check of the raylet waits on the dead
GCS). So before Ray starts, the launcher forks this watchdog in a session of its own
(a SIGKILL of the launcher's process group leaves it to clean up). Every
:data:`INTERVAL` it records the launcher's descendants with their start times; when
the launcher ends (a pidfd tells it at once, however the launcher died) it SIGKILLs
each recorded process that still runs, through a pidfd and only if its start time is
the recorded one (never a later process that reused the pid), then exits.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys

from disttrain.comm.procstat import descendants, ended

__all__ = ["INTERVAL", "watch"]

#: Seconds between two records of the launcher's descendants: a process started and
#: orphaned within one interval of the launcher's death can escape.
INTERVAL = 0.5


def watch() -> int | None:
    """Fork the watchdog of this process's tree; its pid (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    launcher = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        _guard(launcher)
    finally:
        os._exit(0)


def _guard(launcher: int) -> None:
    """Record the launcher's tree until it ends, then end what is left of the tree."""
    me = os.getpid()
    known: dict[int, str] = {}
    with contextlib.suppress(OSError):
        fd = os.pidfd_open(launcher)
        while not select.select([fd], [], [], INTERVAL)[0]:
            known.update(descendants(launcher))
        os.close(fd)
    for pid, start in known.items():
        if pid != me and not ended(pid, start):
            _kill(pid, start)


def _kill(pid: int, start: str) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``start``."""
    with contextlib.suppress(OSError):
        fd = os.pidfd_open(pid)
        try:
            if not ended(pid, start):  # checked after the pidfd pins the process
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        finally:
            os.close(fd)
