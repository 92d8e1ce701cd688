"""Typed errors of the communication layer, each naming the rank it concerns."""

from __future__ import annotations

import re

__all__ = [
    "CollectiveMismatch",
    "DisttrainError",
    "LeftOut",
    "OutOfMemory",
    "PeerFailure",
    "TooFewWorkers",
    "UsageError",
    "gist",
    "is_peer_error",
]

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


def is_peer_error(exc: BaseException) -> bool:
    """True if ``exc`` says a peer failed: torch's DistError, a :class:`PeerFailure`, or
    or an error whose text speaks of a peer, a closed connection or a timeout (gloo's)."""
    import torch.distributed as dist

    if isinstance(exc, (dist.DistError, PeerFailure)):
        return True
    return bool(_PEER_ERROR.search(gist(exc)))


class OutOfMemory(DisttrainError):
    """This process could not allocate a tensor: its memory or its limit is used up."""
