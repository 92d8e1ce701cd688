"""A worker's life tied to its launcher's (killed when it dies, however), and its name.

The kernel sends a process the signal it asked for with ``prctl(PR_SET_PDEATHSIG)``
when its parent thread ends: SIGKILL of the launcher's pid, of its process group, a
crash or a normal exit alike. A launcher that died before the request took effect is
seen by the parent check that follows it (the process was re-parented by then).
Linux only; elsewhere :func:`tie` does nothing and says so by returning False.

:func:`name` gives a worker the process name ``disttrain rN`` (``ps -o comm``, ``top``):
a forked worker's command line is its launcher's, so ``ps`` could not tell them apart.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["LAUNCHER_ENV", "STARTER_ENV", "name", "tie", "tie_from_env", "tie_to_starter"]

#: Set by our launcher for its workers: its pid (their parent, when it started them).
LAUNCHER_ENV = "DISTTRAIN_LAUNCHER_PID"
#: Set by :mod:`disttrain.launch.commands` for the commands it starts (``compare``'s and the
#: benchmarks' trainings): its pid.
STARTER_ENV = "DISTTRAIN_STARTER_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PR_SET_NAME = 15  # at most 15 bytes and a NUL


def _prctl(option: int, value: int | bytes) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return int(ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)) == 0


def name(rank: int) -> bool:
    """Name this process ``disttrain r<rank>``; False where that cannot be done."""
    return _prctl(_PR_SET_NAME, f"disttrain r{rank}".encode()[:15])


def tie(launcher: int) -> bool:
    """Be SIGKILLed when ``launcher`` (this process's parent) dies; exit at once if it
    already has. False where the platform has no such request."""
    if not _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL):
        return False
    if os.getppid() != launcher:
        os._exit(1)  # nobody is left to read a line or an exit code
    return True


def tie_from_env() -> bool:
    """:func:`tie` to the launcher named in :data:`LAUNCHER_ENV`, when it is our parent's
    pid there (an exec'd worker; under ``torchrun`` the variable is not set)."""
    value = os.environ.get(LAUNCHER_ENV, "")
    return value.isdigit() and tie(int(value))


def tie_to_starter() -> bool:
    """A command that ``compare`` or a benchmark started (:data:`STARTER_ENV`): SIGTERM when
    that process dies, however, so that the command stops its own workers as on Ctrl-C
    (a launcher, unlike a worker, has a job to end). Only when the starter is this
    process's parent: started through a wrapper (``cluster run --``), the wrapper is, and
    it is tied itself. The variable is not passed on to this command's own children."""
    value = os.environ.pop(STARTER_ENV, "")
    if not value.isdigit() or os.getppid() != int(value):
        return False
    if not _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM):
        return False
    if os.getppid() != int(value):  # the starter died before the request took effect
        os._exit(143)
    return True
