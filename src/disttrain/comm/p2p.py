"""Metered point-to-point messages: the only way our own collectives send data.

Ranks here are *group* ranks; they are translated to global ranks for
torch.distributed and for the meter. A receive and its matching send are
always posted together (``irecv`` + ``isend``, then wait on both), so no ordering
between peers is needed to avoid a deadlock. (The design note's "blocking recv
is 5-50x slower" did not reproduce: disttrain bench p2p-posting, RESULTS.md.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from disttrain.comm.meter import record_send

__all__ = [
    "exchange",
    "global_rank",
    "group_rank",
    "group_size",
    "irecv",
    "isend",
    "post",
    "recv",
    "send",
    "staged",
]


def group_size(group: ProcessGroup | None = None) -> int:
    return dist.get_world_size(group)


def group_rank(group: ProcessGroup | None = None) -> int:
    return dist.get_rank(group)


def global_rank(group: ProcessGroup | None, rank: int) -> int:
    """The global rank of ``rank`` in ``group`` (the default group maps to itself)."""
    if group is None or group is dist.GroupMember.WORLD:
        return rank
    return dist.get_global_rank(group, rank)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def staged(tensor: torch.Tensor, group: ProcessGroup | None = None) -> bool:
    """True for a CUDA tensor on a gloo group (``--backend gloo``): gloo has no CUDA
    send/recv, so such messages go through a host copy."""
    return tensor.is_cuda and dist.get_backend(group) == "gloo"


class _Staged:
    """A send or receive staged through a host copy: ``wait`` copies a receive to the device.

    Holds the host tensor until the transfer is done (a send's copy must outlive it)."""

    def __init__(self, work: Any, host: torch.Tensor, into: torch.Tensor | None) -> None:
        self.work, self.host, self.into = work, host, into

    def wait(self) -> bool:
        self.work.wait()
        if self.into is not None:
            self.into.copy_(self.host)
        return True


def _send(tensor: torch.Tensor, peer: int, group: ProcessGroup | None, tag: int = 0) -> Any:
    """``dist.isend`` to global rank ``peer``, staged through the host where gloo needs it."""
    if staged(tensor, group):
        host = tensor.detach().cpu()
        return _Staged(dist.isend(host, dst=peer, group=group, tag=tag), host, None)
    return dist.isend(tensor, dst=peer, group=group, tag=tag)


def _recv(tensor: torch.Tensor, peer: int, group: ProcessGroup | None, tag: int = 0) -> Any:
    """``dist.irecv`` from global rank ``peer``, staged through the host where gloo needs it."""
    if staged(tensor, group):
        host = torch.empty(tensor.shape, dtype=tensor.dtype)
        return _Staged(dist.irecv(host, src=peer, group=group, tag=tag), host, tensor)
    return dist.irecv(tensor, src=peer, group=group, tag=tag)


def isend(tensor: torch.Tensor, dst: int, group: ProcessGroup | None = None, tag: int = 0) -> Any:
    """Post a metered send of the contiguous ``tensor`` to group rank ``dst``; return its work.

    The caller waits on the work before writing ``tensor`` again. For
    algorithms that keep several messages in flight (segment pipelining).
    """
    peer = global_rank(group, dst)
    work = _send(tensor, peer, group, tag)
    record_send(peer, _nbytes(tensor))
    return work


def irecv(tensor: torch.Tensor, src: int, group: ProcessGroup | None = None, tag: int = 0) -> Any:
    """Post a receive into the contiguous ``tensor`` from group rank ``src``; return its work.

    ``tag`` keeps two streams between the same pair of ranks apart (a pipeline's
    activations and gradients both flow from one neighbour when it has 2 ranks)."""
    return _recv(tensor, global_rank(group, src), group, tag)


def exchange(
    send_tensor: torch.Tensor | None,
    dst: int | None,
    recv_tensor: torch.Tensor | None,
    src: int | None,
    group: ProcessGroup | None = None,
) -> None:
    """Send ``send_tensor`` to ``dst`` while receiving ``recv_tensor`` from ``src``.

    Either side may be ``None`` (a pure send or a pure receive). Empty tensors
    are not sent at all: both sides know the length, so nothing is lost.
    """
    works: list[Any] = []
    if recv_tensor is not None and src is not None and recv_tensor.numel() > 0:
        works.append(_recv(recv_tensor, global_rank(group, src), group))
    if send_tensor is not None and dst is not None and send_tensor.numel() > 0:
        peer = global_rank(group, dst)
        works.append(_send(send_tensor.contiguous(), peer, group))
        record_send(peer, _nbytes(send_tensor))
    for work in works:
        work.wait()


def post(
    sends: Sequence[tuple[torch.Tensor, int]],
    recvs: Sequence[tuple[torch.Tensor, int]],
    group: ProcessGroup | None = None,
) -> None:
    """Post every receive, then every send, and wait for all: ``(tensor, group rank)`` pairs.

    For a rank that talks to several peers at once (a tree node and its
    children, the star's root, all-to-all). Empty tensors are skipped, as in
    :func:`exchange`. Send tensors must not be written until this returns.
    """
    works: list[Any] = []
    for tensor, src in recvs:
        if tensor.numel() > 0:
            works.append(_recv(tensor, global_rank(group, src), group))
    for tensor, dst in sends:
        if tensor.numel() > 0:
            peer = global_rank(group, dst)
            works.append(_send(tensor.contiguous(), peer, group))
            record_send(peer, _nbytes(tensor))
    for work in works:
        work.wait()


def send(tensor: torch.Tensor, dst: int, group: ProcessGroup | None = None) -> None:
    exchange(tensor, dst, None, None, group)


def recv(tensor: torch.Tensor, src: int, group: ProcessGroup | None = None) -> None:
    exchange(None, None, tensor, src, group)
