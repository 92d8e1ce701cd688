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
the recorded one (never a later process that reused the pid). A process started within
an interval of the launcher's death is in no record (under load the records come later
still: one of a local Ray's agents, started as the launcher was killed, outlived it in a
suite run), so the tree also carries a tag: the launcher puts :data:`TAG_ENV` in its
environment before it starts anything, every process it starts inherits it, and after
the records the watchdog ends every process whose environment holds the tag, until none
is left (a dying process of the tree may start another). Then it exits.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import sys

from disttrain.comm.procstat import descendants, ended, start_time

__all__ = ["INTERVAL", "TAG_ENV", "watch"]

#: Seconds between two records of the launcher's descendants: a process started and
#: orphaned within one interval of the launcher's death can escape.
INTERVAL = 0.5
#: The variable whose value (unique to one launcher) marks its tree's processes.
TAG_ENV = "DISTTRAIN_REAPER_TAG"
#: Sweeps of the tagged processes at most, after the launcher's death.
SWEEPS = 5


def watch() -> int | None:
    """Fork the watchdog of this process's tree; its pid (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    launcher = os.getpid()
    tag = f"{launcher}-{secrets.token_hex(8)}"
    os.environ[TAG_ENV] = tag  # inherited by all the launcher starts from now on
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        _guard(launcher, tag)
    finally:
        os._exit(0)


def _guard(launcher: int, tag: str) -> None:
    """Record the launcher's tree until it ends, then end what is left of the tree: the
    recorded processes, then the tagged ones."""
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
    for _ in range(SWEEPS):
        tagged = _tagged(tag, me)
        if not tagged:
            return
        for pid, start in tagged.items():
            _kill(pid, start)


def _tagged(tag: str, me: int) -> dict[int, str]:
    """Live processes (not ``me``) whose environment holds ``TAG_ENV=tag``: pid -> start
    time (read before the environment, so that a reused pid is never taken for one)."""
    mark = f"{TAG_ENV}={tag}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        start = start_time(int(entry))
        with contextlib.suppress(OSError), open(f"/proc/{entry}/environ", "rb") as fh:
            if mark in fh.read().split(b"\0") and not ended(int(entry), start):
                found[int(entry)] = start
    return found


def _kill(pid: int, start: str) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``start``."""
    with contextlib.suppress(OSError):
        fd = os.pidfd_open(pid)
        try:
            if not ended(pid, start):  # checked after the pidfd pins the process
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        finally:
            os.close(fd)
