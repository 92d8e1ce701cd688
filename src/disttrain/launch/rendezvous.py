"""A single-host rendezvous for PyTorch's elastic agent that opens no socket.

torch's own rendezvous backends (``static``, ``c10d``) start a TCPStore, and
TCPStore listens on every interface (``::``) whatever address it is given. A
job on one machine needs no network for its control plane, so this handler
gives the agent a file store in a private temporary folder, and the workers
meet through another file store named by ``DISTTRAIN_STORE_FILE``
(see :mod:`disttrain.comm.world`). Multi-node runs use torch's ``c10d``
rendezvous at the address the user names.
"""

from __future__ import annotations

import contextlib
import os

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)

__all__ = ["BACKEND", "FileRendezvous", "register"]

BACKEND = "disttrain-file"


class FileRendezvous(RendezvousHandler):
    """One node, rank 0 of 1; the agent's store is a file store at ``path``."""

    def __init__(self, run_id: str, path: str) -> None:
        self._run_id = run_id
        self._path = path
        self._store: dist.Store | None = None
        self._closed = False

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._store = dist.FileStore(self._path, 1)
        # Workers ignore MASTER_ADDR/PORT (they use DISTTRAIN_STORE_FILE); port 0 marks that.
        return RendezvousInfo(
            dist.PrefixStore(self._run_id, self._store), 0, 1, RendezvousStoreInfo("127.0.0.1", 0)
        )

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        self._closed = True
        return True


def _create(params: RendezvousParameters) -> RendezvousHandler:
    path = params.config.get("store_path")
    if not path:
        raise ValueError("the disttrain-file rendezvous needs rdzv_configs['store_path']")
    if os.path.exists(path):
        os.unlink(path)
    return FileRendezvous(params.run_id, str(path))


def register() -> None:
    """Make ``rdzv_backend='disttrain-file'`` available to the elastic launcher (idempotent)."""
    with contextlib.suppress(ValueError):  # already registered in this process
        rendezvous_handler_registry.register(BACKEND, _create)
