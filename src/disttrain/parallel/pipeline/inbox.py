"""The tensors one pipeline neighbour sends, received in the order its column of the grid
sends them (no message headers: both sides read the order off the same grid)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed import ProcessGroup

from disttrain.comm import p2p

__all__ = ["Inbox"]


class Inbox:
    """The tensors one neighbour sends, in a known order, each receive posted one ahead.

    Holding one receive in flight beyond the tensor being used keeps the
    transfer off the critical path without holding more than one extra buffer
    (1F1B's activation bound is kept). With ``ahead=False`` each receive is
    posted only when its tensor is needed: gloo moves a message's bytes only
    once its receive is posted, so an early post makes this process's gloo
    thread read them while the stage computes, on a core the compute (and the
    peer) also needs; when the sender's action runs just before the one that
    needs it (1F1B's steady state), the early post overlaps nothing.
    """

    def __init__(
        self,
        order: list[tuple[tuple[int, int], tuple[torch.Size, torch.dtype]]],
        src: int,
        device: torch.device,
        group: ProcessGroup | None,
        tag: int,
        requires_grad: bool = False,
        ahead: bool = True,
    ) -> None:
        self.ahead = ahead
        self.order = order  # ((micro-batch, stage), buffer shape) in the sender's order
        self.src = src
        self.tag = tag
        self.device = device
        self.group = group
        self.requires_grad = requires_grad
        self.next = 0
        self.posted: tuple[tuple[int, int], Any, torch.Tensor] | None = None
        if ahead:
            self._post()

    def _post(self) -> None:
        if self.next >= len(self.order):
            self.posted = None
            return
        key, (shape, dtype) = self.order[self.next]
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        self.posted = (key, p2p.irecv(buf, self.src, self.group, tag=self.tag), buf)
        self.next += 1

    def take(self, m: tuple[int, int]) -> torch.Tensor:
        """Wait for (micro-batch, stage) ``m``'s tensor (the next in order); post the next."""
        if not self.ahead:
            self._post()  # the receive for m, now
        assert self.posted is not None and self.posted[0] == m, (m, self.posted)
        _, work, buf = self.posted
        work.wait()
        if self.ahead:
            self._post()
        else:
            self.posted = None
        if self.requires_grad and buf.is_floating_point():
            buf.requires_grad_(True)
        return buf
