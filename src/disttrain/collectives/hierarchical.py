"""Hierarchical allreduce: shared memory inside each host, one network allreduce among hosts.

Horovod's hierarchical allreduce (and NCCL's tree/ring across nodes): the ranks of a
host sum through shared memory (:mod:`shm`); one leader per host (its first rank)
allreduces those sums with a network algorithm (its own setting ``--inter-algorithm``,
``ring`` by default: :class:`HierarchicalConfig`); each leader broadcasts the result to
its host through shared memory. Only one rank per host crosses the network, with the whole tensor.
On one host it is ``shm``; with one rank per host it is the inter-host algorithm.

Pipelined: a tensor above :data:`PIECE_BYTES` goes in pieces of that size. While the
leaders' network allreduce of piece i runs, on a thread and leader group of its own (a
lane: :data:`LANES` pieces are on the link at once, so it stays busy across one piece's
step boundaries), the host sums piece i+1 and broadcasts the piece before, so the two
shared-memory phases hide behind the link and an allreduce costs about the leaders'
network time alone (a flat ring sends 2(n-1)/n·S over each host's link, the leaders
2(H-1)/H·S: at most 1.5x faster at 2 hosts x 2 ranks).

Hosts: each rank's host key is ``$DISTTRAIN_HOST_ID`` if set, else the node rank the
elastic launcher gives it (``$GROUP_RANK``: ranks of one node share a host, as in the
emulated cluster, whose hosts share one kernel), else the host name; the keys are
gathered through the group once per group (an int64 hash each: nothing pickled), and
the host and leader sub-groups are made by every rank of the job in one order, so a
group of only part of the job's ranks can use it only when they share one host.

Cost (``cost()``): the cost model's layout (its workload's ranks per host), or in a job the
launcher's, ``$LOCAL_WORLD_SIZE`` = P ranks per host in
rank order (torchrun numbers node i's ranks i·P..i·P+P-1), the last host taking the
rest; the meter counts what the parts really do on the real hosts.
"""

from __future__ import annotations

import os
import socket
import threading
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.base import (
    ALGORITHMS,
    AlgorithmKind,
    AllReduceAlgorithm,
    Cost,
    CostTerms,
    Op,
    get,
    register,
)
from disttrain.collectives.costs import Path, priced_ranks_per_host
from disttrain.comm import world
from disttrain.comm.commthread import CommThread
from disttrain.comm.errors import UsageError
from disttrain.comm.forming import new_group
from disttrain.comm.meter import meter
from disttrain.comm.p2p import global_rank
from disttrain.comm.world import group_timeout
from disttrain.config import opt, register_section

__all__ = [
    "HOST_ENV",
    "PIECE_BYTES",
    "Hierarchical",
    "HierarchicalConfig",
    "host_key",
    "host_sizes",
    "pieces",
]

#: Overrides the host a rank counts as on (tests; containers that share /dev/shm).
HOST_ENV = "DISTTRAIN_HOST_ID"

#: The pipeline's piece (bytes): at 1 Gbit/s one is ~17 ms on the link against well
#: under 1 ms of shared-memory sum, so filling and draining the pipeline costs little; a
#: tensor of one piece or less runs the three phases one after the other; smaller pieces
#: fill the pipeline sooner but pay a round trip each.
PIECE_BYTES = 2 << 20


@register_section
@dataclass(frozen=True)
class HierarchicalConfig:
    """Settings of ``--algorithm hierarchical``."""

    TITLE: ClassVar[str] = "hierarchical allreduce (--algorithm hierarchical)"

    inter_algorithm: str = opt(
        "ring", "network algorithm among one leader per host (--algorithm hierarchical)"
    )

    def validate(self) -> None:
        """It must cross a network: a registered algorithm neither one_host nor composite."""
        name = self.inter_algorithm
        if name not in ALGORITHMS:
            raise UsageError(
                f"--inter-algorithm {name!r}: unknown allreduce algorithm; choose one of "
                f"{', '.join(ALGORITHMS)}"
            )
        kind = ALGORITHMS.get(name)
        if kind.one_host or kind.composite:
            raise UsageError(f"--inter-algorithm {name}: choose an algorithm that crosses hosts")


def pieces(numel: int, itemsize: int) -> list[tuple[int, int]]:
    """[start, stop) element bounds of the pipeline's pieces of a flat tensor."""
    per = max(1, PIECE_BYTES // itemsize)
    return [(a, min(a + per, numel)) for a in range(0, numel, per)]


def host_key() -> int:
    """This rank's host as a 63-bit number (``$DISTTRAIN_HOST_ID``, node rank, host name)."""
    if os.environ.get(HOST_ENV):
        name = "id:" + os.environ[HOST_ENV]
    elif os.environ.get("GROUP_RANK"):
        name = "node:" + os.environ["GROUP_RANK"]
    else:
        name = "host:" + socket.gethostname()
    return zlib.crc32(name.encode()) | (len(name) << 32)


def host_sizes(n: int) -> list[int]:
    """Ranks per host for ``cost()``: the cost model's layout where it prices one
    (``costs.pricing_layout``), else ``$LOCAL_WORLD_SIZE`` (the job's), each in rank order,
    the rest last."""
    per = priced_ranks_per_host() or int(os.environ.get("LOCAL_WORLD_SIZE", n) or n)
    per = max(1, min(per, n))
    sizes = [per] * (n // per)
    return sizes + ([n % per] if n % per else [])


@dataclass
class _Layout:
    hosts: int
    local: ProcessGroup | None  # this rank's host (None: alone on it)
    #: one rank per host, once per lane (empty: not a leader, or one host)
    leaders: tuple[ProcessGroup, ...]
    local_size: int


_layouts: dict[object, _Layout] = {}
_lock = threading.Lock()
#: pieces on the link at once: piece i goes on lane i % LANES, its own thread and group, so
#: the link stays busy across one piece's step boundaries (each a round trip and a wake-up)
LANES = 2
_inter: list[CommThread] = []  # one thread a lane: its pieces in order
Sent = torch.futures.Future[torch.Tensor]  # a piece's network sum, once its lane ran it


def _inter_thread(lane: int) -> CommThread:
    with _lock:
        while len(_inter) < LANES:
            _inter.append(CommThread(f"disttrain-hierarchical-{len(_inter)}"))
        return _inter[lane]


def _layout(group: ProcessGroup | None) -> _Layout:
    key = group if group is not None else dist.GroupMember.WORLD
    with _lock:
        if key not in _layouts:
            _layouts[key] = _make_layout(group)
            world.at_shutdown(_forget)  # the sub-groups must not outlive the job's group
        return _layouts[key]


def _forget() -> None:
    with _lock:
        _layouts.clear()
        for thread in _inter:
            thread.close()
        _inter.clear()


def _make_layout(group: ProcessGroup | None) -> _Layout:
    n, me = dist.get_world_size(group), dist.get_rank(group)
    keys = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(keys, torch.tensor([host_key()], dtype=torch.int64), group=group)
    order: dict[int, list[int]] = {}
    for r, k in enumerate(keys):
        order.setdefault(int(k), []).append(global_rank(group, r))
    hosts = list(order.values())
    mine = next(h for h in hosts if global_rank(group, me) in h)
    timeout = group_timeout()
    local, leaders = None, ()
    if 1 < len(hosts) < n:
        if n != dist.get_world_size():
            raise UsageError(
                "--algorithm hierarchical: on a group of part of the job's ranks spread over "
                "several hosts, which is not supported (its sub-groups are made by every rank)"
            )
        # every rank makes every sub-group, in the same order (torch's new_group is
        # collective over the job; its local-synchronisation mode deadlocks on
        # overlapping groups: a leader is in two)
        for h in hosts:
            made = new_group(h, timeout=timeout) if len(h) > 1 else None
            if h is mine:
                local = made
        firsts = [h[0] for h in hosts]
        lanes = tuple(new_group(firsts, timeout=timeout) for _ in range(LANES))
        if global_rank(group, me) in firsts:
            leaders = lanes
    return _Layout(len(hosts), local, leaders, len(mine))


def _finish(piece: torch.Tensor, sent: Sent | None, local: ProcessGroup | None) -> None:
    """Wait for ``piece``'s network sum (leaders), then broadcast it inside the host."""
    from disttrain.collectives.shm import broadcast

    if sent is not None:
        sent.wait()  # re-raises the network allreduce's error here
    if local is not None:
        broadcast(piece, 0, local)


def _sum(
    inter: AllReduceAlgorithm, piece: torch.Tensor, leaders: ProcessGroup
) -> Callable[[], torch.Tensor]:
    """The leaders' network allreduce of ``piece``, to run on a lane's thread; a caller's
    ``meter.counting()`` sees its bytes (:meth:`Meter.on_behalf`)."""

    def run() -> torch.Tensor:
        inter.reduce_flat(piece, leaders)
        return piece

    return meter.on_behalf(run)


class Hierarchical(AllReduceAlgorithm):
    """shm inside each host, the inter-host algorithm among leaders, shm broadcast back."""

    name = "hierarchical"

    def __init__(self, settings: HierarchicalConfig | None = None) -> None:
        #: the network algorithm among the leaders (``--inter-algorithm``)
        self.inter = get((settings or HierarchicalConfig()).inter_algorithm)

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        layout = _layout(group)
        n = dist.get_world_size(group)
        if layout.hosts == 1:  # one host: shared memory only
            get("shm").reduce_flat(flat, group)
            return
        if layout.local_size == 1 and layout.hosts == n:  # one rank per host: the network
            self.inter.reduce_flat(flat, group)
            return
        shm, inter = get("shm"), self.inter
        # every rank of a host runs the same shm calls in the same order: sum piece i,
        # then broadcast piece i-LANES+1 (its leader first waits for that piece's network
        # sum), so LANES pieces are on the link at once
        flight: deque[tuple[torch.Tensor, Sent | None]] = deque()
        for i, (a, b) in enumerate(pieces(flat.numel(), flat.element_size())):
            piece = flat[a:b]
            if layout.local is not None:
                shm.reduce_flat(piece, layout.local)
            sent = None
            if layout.leaders:
                lane = i % LANES
                sent = _inter_thread(lane).submit(_sum(inter, piece, layout.leaders[lane]))
            flight.append((piece, sent))
            if len(flight) == LANES:
                _finish(*flight.popleft(), layout.local)
        while flight:
            _finish(*flight.popleft(), layout.local)

    def cost(
        self,
        nbytes: int,
        world_size: int,
        rank: int = 0,
        itemsize: int = 1,
        op: Op = "all_reduce",
    ) -> Cost:
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        sizes = host_sizes(n)
        inter = self.inter
        if len(sizes) == 1:
            return get("shm").cost(nbytes, n, rank, itemsize)
        if len(sizes) == n:
            return inter.cost(nbytes, n, rank, itemsize)
        host, first = 0, 0
        while rank >= first + sizes[host]:
            first += sizes[host]
            host += 1
        s, local = sizes[host], rank - first
        total = Cost(0, 0)
        for a, b in pieces(nbytes // itemsize, itemsize):  # each piece as it runs
            m = (b - a) * itemsize
            if s > 1:  # the sum inside the host, and the broadcast of the result (m copied)
                total += get("shm").cost(m, s, local, itemsize) + Cost(0, 0, m)
            if local == 0:
                total += inter.cost(m, len(sizes), host, itemsize)
        return total


def _chain(algo: Hierarchical, nbytes: int, n: int, itemsize: int) -> Path:
    from disttrain.collectives.paths import path_of  # the lab's reading: not in a run

    # pipelined: the first piece's shm sum, every piece's network allreduce one after
    # the other, the last piece's broadcast (S copied in all); the other pieces' shm
    # phases run while the link is busy
    sizes = host_sizes(n)
    if len(sizes) in (1, n):  # one host: shm alone; one rank per host: the network alone
        return path_of(get("shm") if len(sizes) == 1 else algo.inter, nbytes, n, itemsize)
    bounds = pieces(nbytes // itemsize, itemsize)
    first = (bounds[0][1] - bounds[0][0]) * itemsize
    last = (bounds[-1][1] - bounds[-1][0]) * itemsize
    inner = path_of(get("shm"), first, max(sizes), itemsize)
    outers = [path_of(algo.inter, (b - a) * itemsize, len(sizes), itemsize) for a, b in bounds]
    outer, name = outers[0], algo.inter.name
    return Path(  # several hosts, one of them with several ranks: both phases run
        inner.steps + sum(o.steps for o in outers) + 1,
        sum(o.critical_bytes for o in outers),
        inner.reduced_bytes + sum(o.reduced_bytes for o in outers),
        sum(o.bytes_per_rank for o in outers),
        sum(o.messages_per_rank for o in outers),
        f"shm inside hosts, then {name} in {len(bounds)} pieces: {outer.latency_formula} each",
        f"{name} among {len(sizes)} hosts: {outer.bandwidth_formula}",
        copied_bytes=inner.copied_bytes + last,
    )


def _steps(algo: Hierarchical, n: int) -> str:
    from disttrain.collectives.paths import steps_formula  # the lab's reading: not in a run

    hosts = len(host_sizes(n))
    if hosts in (1, n):
        return steps_formula(get("shm") if hosts == 1 else algo.inter, n)
    return f"shm + {steps_formula(algo.inter, hosts)}"


register(
    AlgorithmKind(
        Hierarchical,
        CostTerms(_chain, _steps),
        section=HierarchicalConfig,
        composite=True,
        table_position=6,
        follows_hosts=True,
    )
)
