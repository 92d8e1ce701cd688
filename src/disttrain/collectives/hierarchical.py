"""Hierarchical allreduce: shared memory inside each host, one network allreduce among hosts.

Horovod's hierarchical allreduce (and NCCL's tree/ring across nodes): the ranks of a
host sum through shared memory (:mod:`shm`); one leader per host (its first rank)
allreduces those sums with a network algorithm (:func:`inter_algorithm`, ``ring`` by
default, ``--inter-algorithm``); each leader broadcasts the result to its host through
shared memory. Only one rank per host crosses the network, with the whole tensor.
On one host it is ``shm``; with one rank per host it is the inter-host algorithm.

Hosts: each rank's host key is ``$DISTTRAIN_HOST_ID`` if set, else the node rank the
elastic launcher gives it (``$GROUP_RANK``: ranks of one node share a host, as in the
emulated cluster, whose hosts share one kernel), else the host name; the keys are
gathered through the group once per group (an int64 hash each: nothing pickled), and
the host and leader sub-groups are made by every rank of the job in one order, so a
group of only part of the job's ranks can use it only when they share one host.

Cost (``cost()``): the launcher's layout, ``$LOCAL_WORLD_SIZE`` = P ranks per host in
rank order (torchrun numbers node i's ranks i·P..i·P+P-1), the last host taking the
rest; the meter counts what the parts really do on the real hosts.
"""

from __future__ import annotations

import os
import socket
import threading
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.collectives.base import (
    AllReduceAlgorithm,
    Cost,
    get,
    inter_algorithm,
    register,
)
from disttrain.collectives.costs import Path
from disttrain.comm import world
from disttrain.comm.errors import UsageError
from disttrain.comm.p2p import global_rank
from disttrain.comm.world import group_timeout

__all__ = ["HOST_ENV", "Hierarchical", "host_key", "host_sizes"]

#: Overrides the host a rank counts as on (tests; containers that share /dev/shm).
HOST_ENV = "DISTTRAIN_HOST_ID"


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
    """Ranks per host for ``cost()``: ``$LOCAL_WORLD_SIZE`` each in rank order, the rest last."""
    per = int(os.environ.get("LOCAL_WORLD_SIZE", n) or n)
    per = max(1, min(per, n))
    sizes = [per] * (n // per)
    return sizes + ([n % per] if n % per else [])


@dataclass
class _Layout:
    hosts: int
    local: ProcessGroup | None  # this rank's host (None: alone on it)
    leaders: ProcessGroup | None  # one rank per host (None: not a leader, or one host)
    local_size: int


_layouts: dict[object, _Layout] = {}
_lock = threading.Lock()


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
    local = leaders = None
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
            made = dist.new_group(h, timeout=timeout) if len(h) > 1 else None
            if h is mine:
                local = made
        firsts = [h[0] for h in hosts]
        made = dist.new_group(firsts, timeout=timeout)
        if global_rank(group, me) in firsts:
            leaders = made
    return _Layout(len(hosts), local, leaders, len(mine))


@register
class Hierarchical(AllReduceAlgorithm):
    """shm inside each host, the inter-host algorithm among leaders, shm broadcast back."""

    name = "hierarchical"
    composite = True
    reads_settings = ("inter_algorithm",)
    table_position = 6

    def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
        layout = _layout(group)
        n = dist.get_world_size(group)
        if layout.hosts == 1:  # one host: shared memory only
            get("shm").reduce_flat(flat, group)
            return
        if layout.local_size == 1 and layout.hosts == n:  # one rank per host: the network
            get(inter_algorithm()).reduce_flat(flat, group)
            return
        if layout.local is not None:
            get("shm").reduce_flat(flat, layout.local)
        if layout.leaders is not None:
            get(inter_algorithm()).reduce_flat(flat, layout.leaders)
        if layout.local is not None:
            from disttrain.collectives.shm import broadcast  # (registration order: by name)

            broadcast(flat, 0, layout.local)

    def cost(self, nbytes: int, world_size: int, rank: int = 0, itemsize: int = 1) -> Cost:
        n = world_size
        if n == 1 or nbytes == 0:
            return Cost(0, 0)
        sizes = host_sizes(n)
        inter = get(inter_algorithm())
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
        if s > 1:  # the sum inside the host, and the broadcast of the result (S copied)
            total += get("shm").cost(nbytes, s, local, itemsize) + Cost(0, 0, nbytes)
        if local == 0:
            total += inter.cost(nbytes, len(sizes), host, itemsize)
        return total

    def chain(self, nbytes: int, n: int, itemsize: int) -> Path:
        # the largest host's shm sum, then the leaders' network allreduce, then the
        # broadcast (S copied): one after the other
        sizes = host_sizes(n)
        inner = get("shm").critical_path(nbytes, max(sizes), itemsize)
        outer = get(inter_algorithm()).critical_path(nbytes, len(sizes), itemsize)
        copied = inner.copied_bytes + (nbytes if max(sizes) > 1 and len(sizes) > 1 else 0)
        return Path(
            inner.steps + outer.steps + (1 if copied > inner.copied_bytes else 0),
            outer.critical_bytes, inner.reduced_bytes + outer.reduced_bytes,
            outer.bytes_per_rank, outer.messages_per_rank,
            f"shm inside hosts, then {inter_algorithm()}: {outer.latency_formula}",
            f"{inter_algorithm()} among {len(sizes)} hosts: {outer.bandwidth_formula}",
            copied_bytes=copied,
        )  # fmt: skip

    def steps_formula(self, n: int) -> str:
        hosts = len(host_sizes(n))
        if hosts in (1, n):
            return get("shm" if hosts == 1 else inter_algorithm()).steps_formula(n)
        return f"shm + {get(inter_algorithm()).steps_formula(hosts)}"
