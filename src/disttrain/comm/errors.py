"""Typed errors of the communication layer, each naming the rank it concerns."""

from __future__ import annotations

__all__ = ["CollectiveMismatch", "DisttrainError", "OutOfMemory", "PeerFailure", "UsageError"]


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


class OutOfMemory(DisttrainError):
    """This process could not allocate a tensor: its memory or its limit is used up."""
