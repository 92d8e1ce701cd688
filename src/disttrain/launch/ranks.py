"""Start N processes of one command on this host, each with its own variables, and wait.

The mechanics of a launcher without torch's elastic agent (``disttrain run -np``,
horovodrun's local launch: :mod:`disttrain.horovod.runner` says which variables): each
process is SIGKILLed by the kernel when this launcher dies (:mod:`.tether`); when one
fails, the others get SIGTERM, then SIGKILL after 5 s, and the launcher exits with the
failure's code; Ctrl-C stops them all and gives 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from disttrain.comm.errors import UsageError
from disttrain.launch.tether import tie

__all__ = ["run"]

#: seconds a process has to leave after SIGTERM before SIGKILL
GRACE = 5.0


def run(command: Sequence[str], envs: Sequence[dict[str, str]]) -> int:
    """Start ``command`` once per entry of ``envs`` (rank i gets ``os.environ`` updated by
    ``envs[i]``); 0 once all exit 0, else the first failure's code."""
    me = os.getpid()
    procs: list[subprocess.Popen[Any]] = []
    try:
        for env in envs:
            procs.append(
                subprocess.Popen(
                    list(command), env={**os.environ, **env}, preexec_fn=lambda: _tie(me)
                )
            )
        return _wait(procs)
    except FileNotFoundError as exc:
        raise UsageError(f"run: cannot start {command[0]!r}: {exc.strerror}") from exc
    except KeyboardInterrupt:
        return 130  # the processes are stopped below
    finally:
        _stop(procs)


def _tie(launcher: int) -> None:
    tie(launcher)  # dies with the launcher, however it dies
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(procs: list[subprocess.Popen[Any]]) -> None:
    """SIGTERM the ones still running, then SIGKILL after :data:`GRACE` seconds."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + GRACE
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _wait(procs: list[subprocess.Popen[Any]]) -> int:
    """0 when every process exits 0; else the first failure's code, the others stopped."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank, code = failed[0]
            sys.stderr.write(
                f"disttrain run: rank {rank} exited with code {code}; stopping the others\n"
            )
            _stop(procs)
            return code if code and code > 0 else 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)
