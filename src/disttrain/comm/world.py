"""The process's place in the job: initialisation, rank, size, device and timeouts.

A worker learns its rank from the environment that PyTorch's elastic launcher
(``torchrun``) sets. For single-host runs our launcher also sets
``DISTTRAIN_STORE_FILE``: the process group then meets through a file store
instead of a TCPStore, because torch's TCPStore listens on every interface
(``::``) whatever host it is given, and gloo is pinned to the loopback
interface. Nothing then listens beyond 127.0.0.1.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from disttrain.comm.errors import UsageError

__all__ = [
    "STORE_FILE_ENV",
    "World",
    "current",
    "group_timeout",
    "init",
    "is_initialized",
    "local_rank",
    "rank",
    "shutdown",
    "size",
]

#: Environment variable naming the file store of a single-host job.
STORE_FILE_ENV = "DISTTRAIN_STORE_FILE"


@dataclass(frozen=True)
class World:
    """Where this process stands: its ranks, the backend and its device."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    timeout: float

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_world: World | None = None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None else int(value)


def init(device: str = "cpu", timeout: float = 60.0, threads: int | None = 1) -> World:
    """Join the job described by the environment, or form a job of one process.

    ``device`` is ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per local rank).
    ``timeout`` bounds every collective, in seconds. ``threads`` sets torch's
    intra-op threads (one by default, so that N workers share N cores fairly);
    ``None`` leaves torch's choice.
    """
    global _world
    if _world is not None:
        return _world
    if threads is not None:
        torch.set_num_threads(threads)
    rank = _env_int("RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)
    lrank = _env_int("LOCAL_RANK", 0)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available on this machine")
        backend = "nccl"
        torch_device = torch.device("cuda", lrank % torch.cuda.device_count())
        torch.cuda.set_device(torch_device)
    elif device == "cpu":
        backend = "gloo"
        torch_device = torch.device("cpu")
    else:
        raise UsageError(f"unknown device {device!r}: use cpu or cuda")

    store_file = os.environ.get(STORE_FILE_ENV)
    if store_file is None and "MASTER_ADDR" not in os.environ:
        # A plain single process: a private file store, so collectives still work.
        if world_size != 1:
            raise UsageError("WORLD_SIZE > 1 but neither MASTER_ADDR nor a store file is set")
        store_file = tempfile.mkstemp(prefix="disttrain-store-")[1]
    pg_timeout = timedelta(seconds=timeout)
    if store_file is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # an elastic restart forms a new group: a fresh store, free of the last round's keys
        store_file += f".{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        store = dist.FileStore(store_file, world_size)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=pg_timeout
        )
    else:
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world_size, timeout=pg_timeout
        )
    _world = World(rank, world_size, lrank, backend, torch_device, timeout)
    return _world


def group_timeout() -> timedelta | None:
    """The job's ``--timeout`` for sub-groups: ``new_group`` would otherwise wait 30 min.

    None (torch's default) outside a world joined by :func:`init`.
    """
    return None if _world is None else timedelta(seconds=_world.timeout)


def is_initialized() -> bool:
    return _world is not None


def current() -> World:
    """The world joined by :func:`init`; raises if there is none."""
    if _world is None:
        raise RuntimeError("disttrain is not initialised: call disttrain.init() first")
    return _world


def rank() -> int:
    return current().rank


def size() -> int:
    return current().world_size


def local_rank() -> int:
    return current().local_rank


def shutdown() -> None:
    """Leave the process group (idempotent)."""
    global _world
    if dist.is_initialized():
        dist.destroy_process_group()
    _world = None
