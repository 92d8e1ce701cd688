"""Workers forked from the launcher: each starts without importing torch again.

A worker started as ``python -m disttrain ARGS`` spends about 1.1 s of CPU importing
torch before it does anything, and a host's N workers pay it N times while the launcher,
which imported torch already, waits (benchmarks/RESULTS.md, "Test suite"). So on one
host, with ``--device cpu`` and one intra-op thread per worker (the defaults), the
launcher forks each worker instead. torch's elastic agent still starts, watches and
stops them: its ``SubprocessContext`` gets the handler below in place of its ``Popen``
(the seam is ``api.get_subprocess_handler``; :func:`forking` returns False, and workers
are exec'd as before, on a torch without it). The child runs the same entry point as
the exec'd worker, ``disttrain/__main__.py`` with ``ARGS``, in a new session (as
``Popen`` with ``start_new_session``), with the environment the agent gave it and
default signal handlers, and leaves from there (:func:`disttrain.launch.worker.leave`).

Where a fork would not be safe, workers are exec'd, as ``torchrun`` does:
- ``--device cuda``: a CUDA driver initialised in the launcher (``is_available``) does
  not work in a forked child;
- more than one intra-op thread: GNU OpenMP's thread pool, once the launcher made one,
  hangs a forked child's next parallel region (one thread never enters one);
- multi-node jobs: the agent's TCPStore runs a thread, and its listening socket would be
  inherited.
fork copies only the calling thread; Python's own locks are reset in the child.

A forked worker's parent is the launcher: it dies with it (:mod:`.tether`), first
thing after the fork.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from typing import IO, Any

from torch.distributed.elastic.multiprocessing import api
from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler

from disttrain.launch import tether

__all__ = ["forking"]

#: what the agent may send a worker, besides SIGINT: back to the default (end the process)
_DEFAULTED = (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCHLD,
    signal.SIGALRM,
)


class _Forked:
    """The part of ``subprocess.Popen`` the agent uses on Linux: ``pid``, ``poll``, ``wait``
    (it signals through ``os.killpg(pid)``, the handler's ``close``)."""

    def __init__(self, pid: int, args: tuple[str, ...]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)  # -N: killed by N
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(list(self.args), timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


class _ForkingHandler(SubprocessHandler):
    """torch's handler, forking ``python -m disttrain ARGS`` instead of exec'ing it."""

    def _popen(self, args: tuple[str, ...], env: dict[str, str]) -> Any:
        if tuple(args[1:3]) != ("-m", "disttrain"):
            return super()._popen(args, env)
        sys.stdout.flush()  # or the child writes the launcher's buffered text again
        sys.stderr.flush()
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child; it never returns)
            _child(list(args[3:]), env, self._stdout, self._stderr, launcher)
        return _Forked(pid, args)


def _child(
    argv: list[str],
    env: dict[str, str],
    stdout: IO[str] | None,
    stderr: IO[str] | None,
    launcher: int,
) -> None:
    code = 1
    try:
        tether.tie(launcher)
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in _DEFAULTED:
            signal.signal(sig, signal.SIG_DFL)
        if stdout is not None:
            os.dup2(stdout.fileno(), 1)
        if stderr is not None:
            os.dup2(stderr.fileno(), 2)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [sys.argv[0], *argv]
        # what ``python -m disttrain`` runs; a worker leaves from there with os._exit
        runpy.run_module("disttrain", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # never the launcher's own teardown


def _seam() -> bool:
    return callable(getattr(api, "get_subprocess_handler", None))


@contextlib.contextmanager
def forking(enabled: bool) -> Iterator[bool]:
    """Within the block, the agent forks ``python -m disttrain`` workers (if ``enabled`` and
    this torch has the seam); yields whether it does."""
    if not (enabled and _seam()):
        yield False
        return
    original = api.get_subprocess_handler
    api.get_subprocess_handler = _ForkingHandler  # type: ignore[assignment]
    try:
        yield True
    finally:
        api.get_subprocess_handler = original
