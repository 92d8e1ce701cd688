"""``SyncBatchNorm`` on any device torch.distributed reaches, CPU over gloo included: batch
norm with the statistics of the global batch, every rank's samples together.

torch's own ``nn.SyncBatchNorm`` refuses CPU input ("SyncBatchNorm expected input tensor
to be on GPU or XPU", torch 2.13, gloo, 2 ranks); this one is its drop-in there, with the
same constructor and ``convert_sync_batchnorm(module, process_group=None)``:

    model = SyncBatchNorm.convert_sync_batchnorm(model)   # every BatchNorm*d, in place

In training (and in eval when ``track_running_stats=False``) the forward normalizes with
the mean and variance of the whole global batch; ranks may hold different numbers of
samples. Running statistics get the global mean and the unbiased global variance,
``momentum`` weighting as torch's ``_BatchNorm`` (``None``: cumulative average): equal on
every rank, so no strategy's buffer broadcast or average changes them. The input's
gradient is that of the global batch; the weight's and bias's gradients stay this rank's
share, which the gradients' average then combines (as torch's and Horovod's). In eval
mode with running statistics, in a job of one, or before torch.distributed is set up, it
is a plain batch norm, with no communication. Every rank of ``process_group`` (default: the whole
job) must call it: it is a collective. Horovod's ``hvd.SyncBatchNorm`` is this one on
Horovod's job (:mod:`disttrain.horovod.sync_batch_norm`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["SyncBatchNorm", "convert_sync_batchnorm"]


class SyncBatchNorm(_BatchNorm):
    """Batch norm over the global batch: torch's ``nn.SyncBatchNorm(num_features, eps,
    momentum, affine, track_running_stats, process_group)``, input ``(N, C, ...)`` with at
    least 2 dims."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: ProcessGroup | None = None,
        device: Any = None,
        dtype: Any = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device, dtype, bias=bias
        )
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        # torch's (and Horovod's) check and message: any (N, C, ...), a ValueError below 2
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _group_size(self) -> int:
        """Ranks whose batches make the global one (1: nothing to synchronise)."""
        if not (dist.is_available() and dist.is_initialized()):
            return 1
        return dist.get_world_size(self.process_group)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        batch_stats = self.training or not self.track_running_stats
        # eval with running stats, or one rank: torch's own batch norm (it also counts
        # num_batches_tracked and applies momentum=None there); the size is not asked in eval
        if not batch_stats or self._group_size() == 1:
            return super().forward(input)
        factor = 0.0
        running: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        tracked = self.num_batches_tracked
        if self.training and self.track_running_stats and tracked is not None:
            tracked.add_(1)
            # momentum=None: cumulative average, the factor 1 / batches seen (torch's rule)
            momentum = self.momentum
            factor = 1.0 / float(tracked) if momentum is None else momentum
            running = (self.running_mean, self.running_var)
        out: torch.Tensor = _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, *running, self.eps, factor, self.process_group
        )
        return out

    @classmethod
    def convert_sync_batchnorm(
        cls, module: nn.Module, process_group: ProcessGroup | None = None
    ) -> nn.Module:
        """``module`` with every ``BatchNorm*d`` replaced by this class (torch's
        ``nn.SyncBatchNorm.convert_sync_batchnorm``): the same parameters and buffers
        (shared, not copied), the same training mode; a BatchNorm given alone comes
        back as a new module."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            # the five settings every subclass takes (Horovod's has no group, no bias flag)
            out = cls(
                module.num_features,
                module.eps,
                module.momentum,
                module.affine,
                module.track_running_stats,
            )
            out.process_group = process_group
            if module.affine:  # shared, not copied; a bias=False one's None, as it is
                out.weight, out.bias = module.weight, module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


#: ``convert_sync_batchnorm(model)``: every BatchNorm*d of ``model`` made a SyncBatchNorm
convert_sync_batchnorm = SyncBatchNorm.convert_sync_batchnorm


def _layout(x: torch.Tensor) -> tuple[list[int], list[int]]:
    """(the dims reduced per channel: all but 1; the shape that broadcasts a (C,) vector)."""
    dims = [0, *range(2, x.dim())]
    return dims, [1, x.size(1)] + [1] * (x.dim() - 2)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float16/bfloat16 are computed in float32 (as torch's CPU batch norm accumulates)."""
    return x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32


def _global_moments(
    x: torch.Tensor, group: ProcessGroup | None
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(mean, biased variance, count) per channel over every rank's batch, in float64.

    One all_reduce (SUM) of the packed vector [S (C), Q (C), n]: per rank S = n * m and
    Q = n * (v + m^2) = sum of x^2, where m, v are its own mean and biased variance
    (computed in the input's precision, two-pass, so no cancellation there). Globally
    N = sum n, mean = S / N, var = Q / N - mean^2; in float64 that difference loses
    nothing unless |mean| / std > 1e4. A rank with no samples adds zeros.
    """
    dims, _ = _layout(x)
    channels, n = x.size(1), x.numel() // max(x.size(1), 1)
    packed = torch.zeros(2 * channels + 1, dtype=torch.float64)
    if n > 0:
        v, m = torch.var_mean(x.to(_compute_dtype(x)), dim=dims, correction=0)
        m64 = m.double()
        packed[:channels] = m64 * n
        packed[channels : 2 * channels] = (v.double() + m64 * m64) * n
    packed[-1] = n
    dist.all_reduce(packed, group=group)  # every rank of the module's group
    total = int(packed[-1].item())
    if total <= 1:  # torch's BatchNorm refuses it; the count is the same on every rank
        raise ValueError(
            f"Expected more than 1 value per channel when training, got {total} over all ranks"
        )
    mean = packed[:channels] / total
    var = (packed[channels : 2 * channels] / total - mean * mean).clamp_min(0.0)
    return mean, var, total


def _update_running(
    running_mean: torch.Tensor | None,
    running_var: torch.Tensor | None,
    mean: torch.Tensor,
    var: torch.Tensor,
    count: int,
    factor: float,
) -> None:
    """r <- (1 - f) r + f s, with the unbiased global variance var * N / (N - 1)."""
    if running_mean is not None:
        running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
    if running_var is not None:
        unbiased = var * (count / (count - 1))
        running_var.mul_(1 - factor).add_(unbiased.to(running_var.dtype), alpha=factor)


class _SyncBatchNormFunction(torch.autograd.Function):
    """Forward: one all_reduce of the moments (:func:`_global_moments`). Backward: one
    all_reduce of [sum dy, sum dy * (x - mean)] when the input needs a gradient (the same
    on every rank); the weight's and bias's gradients are local sums (Horovod's rule)."""

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        eps: float,
        factor: float,
        group: ProcessGroup | None,
    ) -> torch.Tensor:
        x = input.contiguous()
        mean64, var64, count = _global_moments(x, group)
        _update_running(running_mean, running_var, mean64, var64, count, factor)
        dtype = _compute_dtype(x)
        mean, invstd = mean64.to(dtype), torch.rsqrt(var64 + eps).to(dtype)
        _, shape = _layout(x)
        # y = (x - mean) * invstd * w + b
        scale = invstd if weight is None else invstd * weight.to(dtype)
        out = (x.to(dtype) - mean.view(shape)) * scale.view(shape)
        if bias is not None:
            out = out + bias.to(dtype).view(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.count, ctx.group = count, group
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, mean, invstd = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dims, shape = _layout(x)
        dy = grad_out.contiguous().to(mean.dtype)
        xmu = x.to(mean.dtype) - mean.view(shape)
        sum_dy, sum_dy_xmu = dy.sum(dims), (dy * xmu).sum(dims)
        # dL/dw = sum dy * x_hat, dL/db = sum dy over this rank's samples only: the
        # optimizer's allreduce adds the other ranks' shares (as Horovod: no sync here)
        grad_w = (sum_dy_xmu * invstd).to(weight.dtype) if need_w else None
        grad_b = sum_dy.to(weight.dtype) if need_b else None
        grad_x = None
        if need_x:
            moments = (sum_dy, sum_dy_xmu)
            grad_x = _input_grad(dy, xmu, weight, invstd, moments, ctx.count, ctx.group)
            grad_x = grad_x.to(x.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


def _input_grad(
    dy: torch.Tensor,
    xmu: torch.Tensor,
    weight: torch.Tensor | None,
    invstd: torch.Tensor,
    moments: tuple[torch.Tensor, torch.Tensor],
    count: int,
    group: ProcessGroup | None,
) -> torch.Tensor:
    """dx = (dy - mean(dy) - (x - mu) * invstd^2 * mean(dy * (x - mu))) * invstd * w, the
    means over the global batch of N = ``count``: one all_reduce (SUM) of the packed
    [sum dy (C), sum dy * (x - mu) (C)] (``moments``), in float64, then divided by N."""
    sum_dy, sum_dy_xmu = moments
    channels = sum_dy.numel()
    packed = torch.cat([sum_dy, sum_dy_xmu]).double()
    dist.all_reduce(packed, group=group)  # the forward's group
    mean_dy = (packed[:channels] / count).to(dy.dtype)
    proj = (packed[channels:] / count).to(dy.dtype) * invstd * invstd
    scale = invstd if weight is None else invstd * weight.to(dy.dtype)
    _, shape = _layout(dy)
    return (dy - mean_dy.view(shape) - xmu * proj.view(shape)) * scale.view(shape)
