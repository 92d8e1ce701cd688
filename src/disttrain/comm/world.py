"""The process's place in the job: initialisation, rank, size, device and timeouts.

A worker learns its rank from the environment that PyTorch's elastic launcher
(``torchrun``) sets, or from a process group that an engine (Ray Train, a user's
script) has already formed: :func:`init` then adopts that group and leaves it to
its owner at :func:`shutdown`. Where the engine does not say which processes share
a host (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``), the
ranks exchange their host names once and group by them (:func:`_hosts_from_group`).
For single-host runs our launcher also sets ``DISTTRAIN_STORE_FILE``: the process
group then meets through a file store instead of a TCPStore, because torch's
TCPStore listens on every interface (``::``) whatever host it is given, and gloo
is pinned to the loopback interface. Nothing then listens beyond 127.0.0.1.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

import torch
import torch.distributed as dist

# Imported now, before any process group forms, for its side effect at import: its
# functions take ``group=group.WORLD`` as a default argument, evaluated at import. The
# first optimizer imports it (Optimizer.__init__ -> torch._dynamo); once a group exists
# that default pins the default group for good, so ``destroy_process_group()`` cannot free
# it, gloo's worker threads live on into the interpreter's teardown, and one that drops a
# finished broadcast then takes the GIL and dies in std::terminate (SIGABRT, "terminate
# called without an active exception"; seen at the end of scripts that call
# ``disttrain.train`` in their own group: tests/launch/test_entry.py). Imported here it
# binds None (no group yet), which means "the default group" at each call. 10 ms.
import torch.distributed.nn.functional

from disttrain.comm import forming
from disttrain.comm.errors import UsageError

__all__ = [
    "STORE_FILE_ENV",
    "World",
    "adopt_store",
    "at_shutdown",
    "cross_rank",
    "cross_size",
    "current",
    "group_timeout",
    "init",
    "is_initialized",
    "job_store",
    "job_store_path",
    "leave_group",
    "local_rank",
    "local_size",
    "rank",
    "rejoin",
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
    local_size: int = 1  # processes of this job on this host
    node_rank: int = 0  # this host's index among the job's hosts (Horovod's cross_rank)
    nodes: int = 1  # hosts of the job (Horovod's cross_size)
    owns_group: bool = True  # False: an engine formed the group and destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_world: World | None = None
#: Groups this process has formed and left (shutdown): a re-init (Horovod's shutdown then
#: init) must not meet on the keys of the last group, which still name its old addresses.
_generation = 0
#: The store the job's first group met on, kept for live membership changes (job_store)
_store: dist.Store | None = None
#: The file of that store when it is a file store (a single-host job's): a joiner opens it
_store_path: str | None = None
_reserved: str | None = None  # a single process's store name (_private_store)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None else int(value)


def init(
    device: str = "cpu", timeout: float = 60.0, threads: int | None = 1, backend: str = "auto"
) -> World:
    """Join the job described by the environment, or form a job of one process.

    ``device`` is ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per local rank).
    ``backend="gloo"`` with ``cuda`` keeps CUDA tensors but talks over gloo, so
    several ranks may share one GPU (local rank mod the GPUs): NCCL refuses two
    ranks on one device, and one-GPU machines prove multi-rank code paths this way.
    ``timeout`` bounds every collective, in seconds. ``threads`` sets torch's
    intra-op threads (one by default, so that N workers share N cores fairly);
    ``None`` leaves torch's choice.
    """
    global _world
    if _world is not None:
        return _world
    if threads is not None:
        torch.set_num_threads(threads)
    adopted = dist.is_initialized()  # an engine (Ray Train, the user) formed the group
    if adopted:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        rank = _env_int("RANK", 0)
        world_size = _env_int("WORLD_SIZE", 1)
    backend, torch_device = _device(device, backend, _env_int("LOCAL_RANK", 0))
    if adopted:
        _world = _adopt(rank, world_size, device, torch_device, timeout)
        return _world
    _form_group(backend, rank, world_size, timedelta(seconds=timeout))
    place = _placement(rank, world_size, adopted=False)
    _world = World(rank, world_size, place[0], backend, torch_device, timeout, *place[1:])
    return _world


def _device(device: str, backend: str, lrank: int) -> tuple[str, torch.device]:
    """(backend, device) for ``--device``: gloo on cpu; NCCL, or gloo if asked, on CUDA.

    A CUDA rank takes GPU ``local rank mod the GPUs`` and makes it current.
    """
    if device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available on this machine")
        backend = "gloo" if backend == "gloo" else "nccl"
        torch_device = torch.device("cuda", lrank % torch.cuda.device_count())
        torch.cuda.set_device(torch_device)
    elif device == "cpu":
        backend = "gloo"
        torch_device = torch.device("cpu")
    else:
        raise UsageError(f"unknown device {device!r}: use cpu or cuda")
    return backend, torch_device


def _adopt(
    rank: int, world_size: int, device: str, torch_device: torch.device, timeout: float
) -> World:
    """The World of a group an engine formed: it owns the group, not us.

    Without LOCAL_RANK, a CUDA rank's GPU comes from its placement's local rank.
    """
    place = _placement(rank, world_size, adopted=True)
    if device == "cuda" and "LOCAL_RANK" not in os.environ:
        torch_device = torch.device("cuda", place[0] % torch.cuda.device_count())
        torch.cuda.set_device(torch_device)
    return World(
        rank,
        world_size,
        place[0],
        dist.get_backend(),
        torch_device,
        timeout,
        *place[1:],
        owns_group=False,
    )


def _form_group(backend: str, rank: int, world_size: int, pg_timeout: timedelta) -> None:
    """Form the process group: on our file store, or on torchrun's store (env://), this
    round's keys under a prefix of their own after a restart.

    A plain single process (no store file, no MASTER_ADDR) gets a private file store.
    gloo's failures to connect the ranks are tried again, all ranks together
    (:func:`disttrain.comm.forming.form_default`).
    """
    global _store, _store_path, _sockets_before
    store_file = os.environ.get(STORE_FILE_ENV)
    if store_file is None and "MASTER_ADDR" not in os.environ:
        # A plain single process: a private file store, so collectives still work.
        if world_size != 1:
            raise UsageError("WORLD_SIZE > 1 but neither MASTER_ADDR nor a store file is set")
        store_file = _private_store()
    store: dist.Store
    if store_file is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        # an elastic restart forms a new group: a fresh store, free of the last round's keys
        store_file += f".{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        if _generation:  # joined before in this process: that file holds the old group's keys
            store_file += f".g{_generation}"
        store = _store = dist.FileStore(store_file, world_size)
        _store_path = store_file
        _sockets_before = set(_sockets().values())  # every socket from here on is a group's
    else:
        # torchrun's store (env:// gives it), as init_process_group's env:// would use it
        store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=pg_timeout))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        if int(restart) > 0 or _generation:
            # torchrun restarted the job: its store outlives a round and still holds the
            # last round's gloo addresses, which a restarted rank may dial (connection
            # refused): this round's keys go under their own prefix
            store = dist.PrefixStore(f"disttrain/round-{restart}.g{_generation}", store)
    forming.form_default(backend, store, rank, world_size, pg_timeout)


def _private_store() -> str:
    """A single process's store file: a unique name reserved in the temp dir; the name and
    the store files made from it (``NAME.0``, ...) go at :func:`shutdown` or at exit."""
    global _reserved
    if _reserved is None:
        _reserved = tempfile.mkstemp(prefix="disttrain-store-")[1]
        atexit.register(_remove_reserved)
    return _reserved


def _remove_reserved() -> None:
    global _reserved
    if _reserved is not None:
        for path in [_reserved, *glob.glob(glob.escape(_reserved) + ".*")]:
            with contextlib.suppress(OSError):
                os.unlink(path)
    _reserved = None


def _placement(rank: int, world_size: int, adopted: bool) -> tuple[int, int, int, int]:
    """(local rank, local size, node rank, nodes): from the launcher's variables, else the group.

    torchrun sets LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK; Ray Train sets
    LOCAL_RANK, LOCAL_WORLD_SIZE and NODE_RANK. A single-host job of ours (its
    file store) is one host. Otherwise the ranks compare host names.
    """
    env = os.environ
    node = env.get("GROUP_RANK", env.get("NODE_RANK"))
    if "LOCAL_RANK" in env and "LOCAL_WORLD_SIZE" in env and node is not None:
        local_size = int(env["LOCAL_WORLD_SIZE"])
        return int(env["LOCAL_RANK"]), local_size, int(node), max(1, world_size // local_size)
    if world_size == 1 or (not adopted and STORE_FILE_ENV in env):
        return _env_int("LOCAL_RANK", rank), world_size, 0, 1
    return _hosts_from_group(rank, world_size)


def _hosts_from_group(rank: int, world_size: int) -> tuple[int, int, int, int]:
    """Group the ranks by host name (one all-gather of 64-byte names at start-up).

    Local rank: this rank's position among the ranks of its host; node rank: its
    host's position in the order hosts first appear by rank (as torchrun numbers
    nodes whose ranks are contiguous).
    """
    name = socket.gethostname().encode()[:64]
    mine = torch.zeros(64, dtype=torch.uint8)
    mine[: len(name)] = torch.tensor(list(name), dtype=torch.uint8)
    if dist.get_backend() == "nccl":
        mine = mine.cuda()
    every = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(every, mine)
    hosts = [bytes(t.cpu().tolist()) for t in every]
    order = list(dict.fromkeys(hosts))  # hosts in order of their first rank
    mine_host = hosts[rank]
    local = [r for r, h in enumerate(hosts) if h == mine_host]
    return local.index(rank), len(local), order.index(mine_host), len(order)


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


def local_size() -> int:
    """Processes of this job on this host."""
    return current().local_size


def cross_rank() -> int:
    """This host's index among the job's hosts (Horovod's ``cross_rank``)."""
    return current().node_rank


def cross_size() -> int:
    """Hosts in the job (Horovod's ``cross_size``)."""
    return current().nodes


#: Called by :func:`shutdown` before the groups go: code above this layer that keeps
#: sub-groups (hierarchical's per-host groups) drops them here. A group still referenced
#: outlives ``destroy_process_group`` and its gloo threads die in the interpreter's
#: teardown: ``terminate called without an active exception`` (SIGABRT at exit).
_shutdown_hooks: list[Callable[[], None]] = []


def at_shutdown(hook: Callable[[], None]) -> None:
    """Run ``hook`` at every :func:`shutdown`, before the process groups are destroyed."""
    if hook not in _shutdown_hooks:
        _shutdown_hooks.append(hook)


def shutdown() -> None:
    """Leave the process group (idempotent); a group an engine formed is left to it."""
    global _world, _store, _store_path, _generation
    for hook in _shutdown_hooks:
        hook()
    owns = _world is None or _world.owns_group
    if owns and dist.is_initialized():
        dist.destroy_process_group()
        _generation += 1  # a later init in this process meets on fresh keys
    _world = _store = _store_path = None
    _remove_reserved()


def job_store() -> dist.Store:
    """The store under the job's process group (its prefixes removed): the file store of a
    single-host job, torchrun's TCPStore otherwise. It outlives a group (:func:`rejoin`)."""
    global _store
    if _store is None:
        if current().owns_group is False:
            raise UsageError("the process group belongs to an engine: its members are its own")
        store = dist.distributed_c10d._get_default_store()
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        _store = store
    return _store


def job_store_path() -> str | None:
    """The file of the job's store (single-host jobs), None for a TCPStore."""
    return _store_path


def adopt_store(store: dist.Store) -> None:
    """Take ``store`` as the job's store: a worker joining a running job (live grow) opens
    the job's file store and meets the others there after leaving its own group of one."""
    global _store
    _store = store


#: The process's sockets before its first group (a file-store job's: the groups' are the
#: rest); None where the store itself is a socket (torchrun's TCPStore).
_sockets_before: set[str] | None = None


def _sockets() -> dict[int, str]:
    """This process's sockets: descriptor -> ``socket:[INODE]`` (``/proc/self/fd``)."""
    found = {}
    for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []:
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:"):
                found[int(fd)] = link
    return found


def _shut_group_sockets() -> None:
    """Shut down (not close: gloo owns them) the sockets the groups opened, so every peer
    still waiting on this process fails at once. ``destroy_process_group`` alone does not
    close them while anything holds a gloo Work or group (a failed step's frames, another
    thread's): a peer blocked on this one would wait out --timeout, answer the survivors'
    roll call too late and be left out (seen: 4 workers, rank 0 or 1 killed, with the
    native, ring, tree and halving-doubling algorithms)."""
    if _sockets_before is None:
        return
    for fd, link in _sockets().items():
        if link in _sockets_before:
            continue
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=os.dup(fd))
            try:  # a listening socket is left alone: gloo's accept loop aborts on it
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
            finally:
                sock.close()  # the duplicate only


def leave_group() -> None:
    """Drop the process group after a peer failed (its pending work ends with it); the
    store stays (:func:`job_store`), for the survivors to meet on."""
    job_store()  # kept before the group that holds it goes
    _shut_group_sockets()
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # a group broken by a lost peer may fail to close
            dist.destroy_process_group()


def rejoin(rank: int, world_size: int, prefix: str) -> World:
    """Form a new process group of ``world_size`` ranks, this one ``rank``, meeting under
    ``prefix`` of the job's store (live shrink: ``disttrain.comm.membership``)."""
    global _world
    old = current()
    store = dist.PrefixStore(prefix, job_store())
    dist.init_process_group(
        old.backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=old.timeout),
    )
    # one host: every rank is local; the local rank (its CPU, its GPU) stays the process's
    local = world_size if old.nodes == 1 else old.local_size
    _world = replace(old, rank=rank, world_size=world_size, local_size=local)
    return _world
