"""Horovod's two exception types, as its scripts catch them."""

from __future__ import annotations

from disttrain.comm.errors import DisttrainError

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]


class HorovodInternalError(DisttrainError):
    """A collective failed on every rank that took part (mismatched calls, a lost peer).

    A ``RuntimeError``, as in Horovod, so ``except RuntimeError`` in old scripts still works.
    """


class HostsUpdatedInterrupt(DisttrainError):
    """The set of hosts changed (elastic mode); ``skip_sync``: the state need not be synced."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
