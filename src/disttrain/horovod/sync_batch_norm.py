"""Horovod's ``SyncBatchNorm`` on CPU over gloo: batch norm with the statistics of the
global batch, every rank's samples together.

The mechanics are :class:`disttrain.dataparallel.sync_batch_norm.SyncBatchNorm` (also the
public ``SyncBatchNorm`` of ``disttrain``, where torch's refuses CPU input); this is that
one with Horovod's constructor (``num_features, eps, momentum, affine,
track_running_stats``: no process group) on Horovod's job: every rank of the job must
call it (a collective on the default group), and a training forward before
``hvd.init()`` is Horovod's ValueError. Eval mode with running statistics, and a job of
one, are a plain batch norm with no communication (and no init needed).
"""

from __future__ import annotations

from disttrain.dataparallel.sync_batch_norm import SyncBatchNorm as _GlobalBatchNorm
from disttrain.horovod.basics import size

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_GlobalBatchNorm):
    """Batch norm over the global batch: ``hvd.SyncBatchNorm(num_features, eps, momentum,
    affine, track_running_stats)``, input ``(N, C, ...)`` with at least 2 dims."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _group_size(self) -> int:
        return size()  # Horovod's job, and its ValueError before hvd.init()
