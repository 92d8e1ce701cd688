"""Naming a hung worker: a roll call among the workers that saw a peer fail.

A worker that hangs (stuck in compute, a deadlock, a sleep) raises nothing and
exits with nothing: its peers time out in their next collective after
``--timeout`` seconds, and the elastic agent then stops every process, the
hung one with the innocent. Neither exit codes nor signals tell them apart.

So a worker that stops because of a peer (a collective timed out, a connection
closed) first *answers a roll call*: it writes ``rank-R`` into the job's roll
call folder (``DISTTRAIN_ROLLCALL_DIR``, set by the single-host launcher) and
waits up to :func:`~disttrain.comm.membership.answer_window` (3 s at most) for the
other workers to answer too. The healthy
ones all block on the hung rank, so they time out within about one step of
each other and answer; the hung rank never runs this code. The launcher then
names, as the root cause, the worker that failed to answer. A rank named by a
:class:`~disttrain.comm.errors.PeerFailure` (a parameter server that reported
a silent worker) is recorded too, for the case where everyone else answered.

Multi-node jobs share no folder: there the roll call is skipped and the
launcher falls back to exit codes.
"""

from __future__ import annotations

import os
import time

from disttrain.comm.membership import answer_window

__all__ = ["ENV", "answer", "read"]

#: The folder of the roll call, shared by the workers of one single-host job.
ENV = "DISTTRAIN_ROLLCALL_DIR"


def answer(rank: int, members: int, timeout: float, named: int | None = None) -> list[int]:
    """Answer as ``rank``; wait for workers ``0..members-1``; return those who did not answer.

    ``named`` is the peer this rank's error named, if any. Without a roll call
    folder (multi-node, ``torchrun``) nothing is written and nothing is known: [].
    """
    root = os.environ.get(ENV)
    if not root or not os.path.isdir(root):
        return []
    # one roll call per restart round (--max-restarts): an old round's answers do not count
    folder = os.path.join(
        root, f"round-{int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')):04d}"
    )
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank-{rank}")
    with open(path + ".tmp", "w") as fh:
        fh.write("" if named is None else str(named))
    os.replace(path + ".tmp", path)  # the launcher never reads half an answer
    # the healthy workers all block on the hung one, so they time out within about one
    # step of each other: the same spread live shrink's survivors wait out
    deadline = time.monotonic() + answer_window(timeout)
    while True:
        missing = [
            r for r in range(members) if not os.path.exists(os.path.join(folder, f"rank-{r}"))
        ]
        if not missing or time.monotonic() >= deadline:
            return missing
        time.sleep(0.05)


def read(root: str) -> dict[int, int | None]:
    """The last round's answers under ``root``: rank -> the peer it named (None: none)."""
    out: dict[int, int | None] = {}
    try:
        rounds = sorted(n for n in os.listdir(root) if n.startswith("round-"))
        folder = os.path.join(root, rounds[-1]) if rounds else root
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        if not name.startswith("rank-") or not name[5:].isdigit():
            continue
        try:
            with open(os.path.join(folder, name)) as fh:
                text = fh.read().strip()
        except OSError:
            continue
        out[int(name[5:])] = int(text) if text.isdigit() else None
    return out
