"""One average over ranks, written once: flatten -> sum -> divide by the ranks -> copy back.

    average(grads, algorithm, group)                        # gradients (hybrid, local SGD warm-up)
    average(params, algorithm, world_size=n)                # parameters (local SGD, start-up sync)
    average(grads, group=g, mean_=compressed_mean)          # a compressed mean (allreduce strategy)

Every tensor of the list travels in one flat buffer (one collective, whatever
the number of tensors), and the sum is divided after it is taken: for the
plain case that is ``flat = all_reduce(flatten(ts)); flat /= n; t.copy_(...)``,
the arithmetic the strategies each wrote before, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import ProcessGroup

from disttrain import collectives
from disttrain.comm import p2p

__all__ = ["average"]


def average(
    tensors: Sequence[torch.Tensor],
    algorithm: collectives.Algorithm = "native",
    group: ProcessGroup | None = None,
    world_size: int | None = None,
    mean_: Callable[[torch.Tensor], object] | None = None,
) -> None:
    """Replace each of ``tensors`` by its mean over the ``world_size`` ranks of ``group``.

    The sum is ``algorithm``'s allreduce over ``group``, divided by the ranks; or
    ``mean_(flat)`` when given, which must leave the mean over the ranks in ``flat``, in
    place (a compressor that writes the mean at once: no × n then ÷ n).
    Nothing happens on one rank or for an empty list. ``world_size`` defaults to
    the group's size (pass it to skip asking when it is known).
    """
    tensors = list(tensors)
    if not tensors:
        return
    n = p2p.group_size(group) if world_size is None else world_size
    if n == 1:
        return
    flat = _flatten_dense_tensors([t.detach() for t in tensors])
    if mean_ is not None:
        mean_(flat)
    else:
        collectives.all_reduce(flat, algorithm, group)
        flat /= n
    with torch.no_grad():
        for t, v in zip(tensors, _unflatten_dense_tensors(flat, tensors), strict=True):
            t.copy_(v)
