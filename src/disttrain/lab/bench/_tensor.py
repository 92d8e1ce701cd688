"""Tensor slicing, ours (Megatron, naive) vs DTensor's Colwise/RowwiseParallel, same processes.

Each process builds the three sharded copies of one Linear(W, 4W)-ReLU-Linear(4W, W)
block (same seed, so the same weights), then runs rounds: in each round one
forward+backward of every variant, timed between barriers, in an order that
rotates from round to round (so none always runs first, right after another's
allocations). ``paired`` is the median over rounds of a variant's step time
over DTensor's in the same round: both saw the same load, which a comparison
of separate runs minutes apart on a shared machine does not give.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["VARIANTS", "paired_steps", "rotation", "summarize"]

#: The variants, in the order of round 0; DTensor is the anchor of the ratios.
VARIANTS = ("megatron", "naive", "dtensor")


def rotation(names: tuple[str, ...], round_: int) -> list[str]:
    """The order of ``names`` in round ``round_``: rotated by one each round."""
    k = round_ % len(names)
    return list(names[k:] + names[:k])


def summarize(
    steps: dict[str, list[float]], nbytes: dict[str, float], anchor: str = "dtensor"
) -> dict[str, Any]:
    """Per variant: median step, bytes per step, and the paired ratio to ``anchor``.

    ``steps[v][i]`` is variant ``v``'s step time in round ``i``; the paired ratio is
    the median over rounds of ``steps[v][i] / steps[anchor][i]``.
    """
    out: dict[str, Any] = {}
    for name, times in steps.items():
        row: dict[str, Any] = {"step": statistics.median(times), "bytes_per_step": nbytes[name]}
        if name != anchor and anchor in steps:
            pairs = zip(times, steps[anchor], strict=True)
            row["paired"] = statistics.median(o / t for o, t in pairs)
            row["ratio"] = row["step"] / statistics.median(steps[anchor])
        out[name] = row
    return out


def _block(width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width))


def paired_steps(a: argparse.Namespace, with_dtensor: bool = True) -> dict[str, Any]:
    """On every rank of the default group: the rounds, then :func:`summarize` of them."""
    import torch.distributed as dist
    from torch.nn import functional as F

    from disttrain.comm.meter import meter
    from disttrain.parallel import tensor

    rank, t = dist.get_rank(), dist.get_world_size()
    models: dict[str, nn.Module] = {}
    for how in ("megatron", "naive"):
        models[how], _ = tensor.shard_model(_block(a.width), rank, t, None, how)
    if with_dtensor:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("cpu", (t,))
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        models["dtensor"] = parallelize_module(_block(a.width), mesh, plan)
    names = tuple(v for v in VARIANTS if v in models)
    x, y = torch.randn(a.batch, a.width, requires_grad=True), torch.randn(a.batch, a.width)

    def step(model: nn.Module) -> Callable[[], None]:
        return lambda: F.mse_loss(model(x), y).backward()

    steps: dict[str, list[float]] = {v: [] for v in names}
    sent: dict[str, list[int]] = {v: [] for v in names}
    for i in range(a.repeats + 2):  # two warm-up rounds
        for name in rotation(names, i):
            before = meter.bytes_sent
            dist.barrier()
            t0 = time.perf_counter()
            step(models[name])()
            dist.barrier()
            if i >= 2:
                steps[name].append(time.perf_counter() - t0)
                sent[name].append(meter.bytes_sent - before)
    return summarize(steps, {v: statistics.mean(sent[v]) for v in names})
