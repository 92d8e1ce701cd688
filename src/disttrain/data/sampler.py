"""A distributed sampler whose global batch at step t is the same for any number of workers.

Each epoch draws one permutation of the training set from (seed, epoch). Global
batch t is ``perm[t*B:(t+1)*B]``; rank r of N takes the r-th contiguous slice of
B/N indices of it. The samples left over when B does not divide the data set
(n mod B of them) are skipped in that epoch only: the next permutation puts
different samples there, so all are used over a run. One worker at batch B
and N workers at batch B therefore see exactly the same samples at each step.
"""

from __future__ import annotations

import torch

__all__ = ["GlobalBatchSampler", "run_steps"]


def run_steps(num_samples: int, batch_size: int, epochs: int, max_steps: int = 0) -> int:
    """The steps a run's budget allows: whole global batches per epoch, times the epochs,
    capped by ``max_steps`` (0: none). The trainer runs these; pre-flight refuses a resume
    that has done them all."""
    total = num_samples // batch_size * epochs  # GlobalBatchSampler.steps_per_epoch each
    return min(total, max_steps) if max_steps else total


class GlobalBatchSampler:
    """Indices of this rank's shard of each global batch, epoch by epoch."""

    def __init__(
        self, num_samples: int, global_batch: int, rank: int, world_size: int, seed: int = 0
    ) -> None:
        if global_batch % world_size:
            raise ValueError(f"global batch {global_batch} is not divisible by {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.local_batch = global_batch // world_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.global_batch

    def global_batch_indices(self, epoch: int, step: int) -> torch.Tensor:
        """All B indices of global batch ``step`` in ``epoch``."""
        perm = self.permutation(epoch)
        return perm[step * self.global_batch : (step + 1) * self.global_batch]

    def permutation(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=g)

    def epoch(self, epoch: int) -> list[torch.Tensor]:
        """This rank's index shard for every step of ``epoch``."""
        perm = self.permutation(epoch)
        lo = self.rank * self.local_batch
        return [
            perm[t * self.global_batch + lo : t * self.global_batch + lo + self.local_batch]
            for t in range(self.steps_per_epoch)
        ]
