"""Run a worker in a forked child so that its death by a signal need not fail the job.

PyTorch's elastic agent stops every process of a job as soon as one exits
with a non-zero status, and a SIGKILL cannot be caught by the process it
kills. For strategies that survive a worker's loss (asynchronous parameter
servers), the process the agent started therefore forks first: the child
trains; the parent waits, and when the child was killed by a signal it
reports the loss on stderr and exits 0, so the agent lets the others finish.
A worker that raised (exit code 1: its own error, already on stderr) is lost
the same way. A worker that stopped because a peer failed (exit code 3: a
server is gone) or over bad input (2) passes its code on: the job cannot go on.
The child dies with its parent (:mod:`.tether`), and a SIGTERM or SIGINT
sent to the parent, as the agent does when it stops a job, is passed on.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

from disttrain.launch import tether

__all__ = ["run_supervised"]

_OWN_ERROR = 1  # the worker's exit code after an exception of its own (launch.worker)


def run_supervised(fn: Callable[[], int], rank: int) -> int:
    """Run ``fn`` in a child process; its exit code, or 0 if a signal killed it."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: train, then leave without running the parent's cleanup
        tether.tie(parent)  # not Linux: the forwarded SIGTERM still ends the child
        code = 1
        try:
            code = fn()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    stopping: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        stopping.append(signum)
        os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:  # pragma: no cover  (PEP 475 retries; kept for clarity)
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if stopping:  # the agent is stopping the job: end as an unsupervised process would
            signal.signal(stopping[0], signal.SIG_DFL)
            os.kill(os.getpid(), stopping[0])
            return 128 + stopping[0]  # pragma: no cover  (only if the signal is blocked)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else sig
        sys.stderr.write(
            f"disttrain: rank {rank}: worker lost (killed by {name}); the job goes on without it\n"
        )
        return 0
    code = os.WEXITSTATUS(status)
    if code == _OWN_ERROR:
        sys.stderr.write(
            f"disttrain: rank {rank}: worker lost (it raised); the job goes on without it\n"
        )
        return 0
    return code
