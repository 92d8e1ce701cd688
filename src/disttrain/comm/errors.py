"""Typed errors of the communication layer, each naming the rank it concerns."""

from __future__ import annotations

import re
import traceback

__all__ = [
    "CollectiveMismatch", "DisttrainError", "LeftOut", "OutOfMemory", "PeerFailure",
    "TooFewWorkers",
    "UsageError", "gist", "is_peer_error", "release_frames",
]  # fmt: skip

# gloo's words for a peer that died or stopped answering
_PEER_ERROR = re.compile(r"peer|timed out|timeout|connection (reset|closed|refused)", re.I)


class DisttrainError(RuntimeError):
    """Base class of the errors disttrain raises on purpose."""


class UsageError(DisttrainError):
    """Bad input from the user: reported as one line with exit code 2."""


class PeerFailure(DisttrainError):
    """A peer died, hung past the timeout, or broke the protocol."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class CollectiveMismatch(DisttrainError):
    """Ranks entered different collectives, or the same one with different sizes."""


class TooFewWorkers(PeerFailure):
    """Live shrink (``--min-workers``): fewer workers than the minimum survived a loss.

    ``lost``: the launch ranks lost; the message names them."""

    def __init__(self, message: str, lost: list[int]) -> None:
        super().__init__(message, lost[0] if lost else None)
        self.lost = lost


class LeftOut(DisttrainError):
    """Live shrink: this worker answered after the survivors had agreed without it."""


def gist(exc: BaseException) -> str:
    """The gist of an error: its first line, without gloo's source path and advice."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)  # "[.../pair.cc:537] "
    return text.split(". This is typically")[0]


def release_frames(exc: BaseException) -> None:
    """Drop the local variables of the finished frames ``exc`` (and the exceptions it was
    raised during) passed through. A failed step's frames hold its collectives' ``Work``
    objects, and a gloo Work keeps its group's connections open after
    ``destroy_process_group``: a survivor still blocked in the step's allreduce on this
    worker then waits ``--timeout`` instead of failing at once, answers the roll call too
    late and is left out (seen: 4 workers, one killed, one of the three survivors lost)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)  # frames still running are kept
        e = e.__cause__ or e.__context__


def is_peer_error(exc: BaseException) -> bool:
    """True if ``exc`` says a peer failed: torch's DistError, a :class:`PeerFailure`, or
    or an error whose text speaks of a peer, a closed connection or a timeout (gloo's)."""
    import torch.distributed as dist

    if isinstance(exc, (dist.DistError, PeerFailure)):
        return True
    return bool(_PEER_ERROR.search(gist(exc)))


class OutOfMemory(DisttrainError):
    """This process could not allocate a tensor: its memory or its limit is used up."""
