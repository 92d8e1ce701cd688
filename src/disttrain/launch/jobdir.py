"""The temporary folder of a job (launcher, ``disttrain run``, a test world), and the
sweep of those whose owner died.

A launcher removes its folder when the job ends, but one killed by SIGKILL cannot: its
processes end with it (:mod:`tether`), the folder stays. So the folder's name carries
its owner, ``disttrain-KIND-PID.START-XXXXXXXX`` (START: the process's start time, so a
reused pid is not taken for the owner), and making a folder first removes the folders
of dead owners. Only folders of this user are touched, never a link; a name in another
form is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile

from disttrain.comm.procstat import ended, start_time

__all__ = ["make", "sweep"]

_NAME = re.compile(r"disttrain-[a-z]+-(\d+)\.(\d+)-[^/]+")


def make(kind: str) -> str:
    """A new folder ``disttrain-KIND-...`` in the temp dir, owned by this process (mode
    0700, as :func:`tempfile.mkdtemp` makes it), after a sweep of the dead owners' ones."""
    sweep()
    me = os.getpid()
    return tempfile.mkdtemp(prefix=f"disttrain-{kind}-{me}.{start_time(me)}-")


def sweep(where: str | None = None) -> list[str]:
    """Remove the job folders in ``where`` (the temp dir) whose owner is gone; their names."""
    where = where or tempfile.gettempdir()
    removed = []
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        for entry in entries:
            match = _NAME.fullmatch(entry.name)
            if match is None or not ended(int(match[1]), match[2]):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                    shutil.rmtree(entry.path)
                    removed.append(entry.name)
    return removed
