"""Horovod's life cycle and topology: init, shutdown, ranks and sizes, build flags, barrier.

``init()`` joins the job through :mod:`disttrain.comm.world` (torchrun's ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, or the file store our launchers set).
Horovod's own ``HOROVOD_RANK``/``HOROVOD_SIZE``/``HOROVOD_LOCAL_*``/``HOROVOD_CROSS_*``
are read where torchrun's are absent; the rendezvous still comes from ``MASTER_ADDR``
or ``DISTTRAIN_STORE_FILE`` (``disttrain run`` sets both kinds): Horovod's HTTP
rendezvous server is not spoken. Without any of them the process is a job of one.
"""

from __future__ import annotations

import atexit
import os

import torch

from disttrain.comm import world
from disttrain.comm.forming import new_group
from disttrain.horovod import engine
from disttrain.horovod import process_sets as sets
from disttrain.horovod.process_sets import ProcessSet
from disttrain.horovod.timeline import start_timeline, stop_timeline

__all__ = [
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "gloo_built",
    "gloo_enabled",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "rank",
    "rocm_built",
    "shutdown",
    "size",
]

#: Horovod's variables -> torchrun's, read only where torchrun's are not set.
_FROM_HOROVOD = {
    "HOROVOD_RANK": "RANK",
    "HOROVOD_SIZE": "WORLD_SIZE",
    "HOROVOD_LOCAL_RANK": "LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE": "LOCAL_WORLD_SIZE",
    "HOROVOD_CROSS_RANK": "GROUP_RANK",
}

_owns_world = False  # True: init joined the world, so shutdown leaves it


def init(comm: object = None, process_sets: object = None) -> None:
    """Join the job (a no-op when already initialised). ``comm`` must be None (no MPI);
    ``process_sets``: None, ``"dynamic"`` or a list of :class:`ProcessSet` to register."""
    global _owns_world
    if engine._engine is not None:
        if engine._engine.gone is None:
            return
        # a peer shut the job down, or the transport failed: Horovod's init would be a no-op
        # and every call would fail; this rank starts again with the peers that do the same
        shutdown()
    if comm is not None:
        raise ValueError("init(comm=...) needs MPI, which this build does not have (gloo only)")
    for theirs, ours in _FROM_HOROVOD.items():
        if theirs in os.environ and ours not in os.environ:
            os.environ[ours] = os.environ[theirs]
    _owns_world = not world.is_initialized()
    timeout = float(os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "60"))
    joined = world.init(device="cpu", timeout=timeout, threads=None)
    # the engine's own group: what it sends cannot meet the training thread's collectives
    group = new_group(list(range(joined.world_size)), timeout=world.group_timeout())
    engine.start(group, joined.rank)
    sets.start(joined.world_size)
    if isinstance(process_sets, list):
        _register_static(process_sets)
    path = os.environ.get("HOROVOD_TIMELINE")
    if path and path != "DYNAMIC":  # Horovod's: record from init to shutdown
        start_timeline(path)
    atexit.register(shutdown)


def _register_static(entries: list[ProcessSet]) -> None:
    seen: list[list[int] | None] = []
    for i, ps in enumerate(entries):
        if ps.ranks in seen:
            raise ValueError(f"init(process_sets=...): entry number {i} is a duplicate")
        seen.append(ps.ranks)
        sets.add_process_set(ps)


def shutdown() -> None:
    """Stop the engine and forget the process sets; leave the world if init joined it."""
    global _owns_world
    if engine._engine is None:
        return
    engine._engine.leave()  # after the queued calls: the peers learn it (engine.py)
    stop_timeline()  # writes HOROVOD_TIMELINE's file (or an unstopped one's) on rank 0
    engine.stop()
    sets.stop()
    if _owns_world:
        world.shutdown()
    _owns_world = False


def is_initialized() -> bool:
    return engine._engine is not None


def _world() -> world.World:
    engine.current()  # Horovod's ValueError before init
    return world.current()


def rank() -> int:
    return _world().rank


def size() -> int:
    return _world().world_size


def local_rank() -> int:
    return _world().local_rank


def local_size() -> int:
    return _world().local_size


def cross_rank() -> int:
    """This host's index among the hosts of the job."""
    return _world().node_rank


def cross_size() -> int:
    return _world().nodes


# --- what this build has: gloo on CPU, and CUDA tensors as torch has them ------------------
def gloo_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    """Horovod's answer under gloo: MPI is not enabled (a ValueError)."""
    engine.current()
    raise ValueError("Horovod MPI is not enabled; this build runs on gloo only.")


def nccl_built() -> int:
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return bool(torch.backends.cuda.is_built())


def rocm_built() -> bool:
    return torch.version.hip is not None
