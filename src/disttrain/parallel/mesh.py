"""A 2-D process mesh: D data-parallel replicas x K ranks of model parallelism each.

Rank r sits at (d, k) = (r // K, r % K): the K ranks of one model replica are
consecutive, so on a cluster they share a machine (pipeline and tensor traffic
is frequent and on the critical path; the data-parallel allreduce is once per
step). Two families of groups:

    inner group d: ranks d*K .. d*K+K-1       (pipeline stages or tensor shards)
    dp group k:    ranks k, K+k, 2K+k, ...    (the same stage/shard of every replica)

``torch.distributed.new_group`` must be called by every rank for every group,
in the same order, so all groups are made here, on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed import ProcessGroup

from disttrain.comm.forming import new_group
from disttrain.comm.world import group_timeout

__all__ = ["Mesh", "layout"]


def layout(world_size: int, dp: int) -> tuple[list[list[int]], list[list[int]]]:
    """The (inner groups, dp groups) of ``world_size`` ranks in ``dp`` replicas."""
    if dp < 1 or world_size % dp:
        raise ValueError(f"{dp} data-parallel groups do not divide {world_size} ranks")
    k = world_size // dp
    inner = [list(range(d * k, (d + 1) * k)) for d in range(dp)]
    data = [list(range(i, world_size, k)) for i in range(k)]
    return inner, data


@dataclass
class Mesh:
    """This rank's place in the mesh and the two groups it belongs to."""

    dp: int
    inner: int
    dp_index: int
    inner_index: int
    inner_ranks: list[int]
    dp_ranks: list[int]
    inner_group: ProcessGroup | None
    dp_group: ProcessGroup | None

    @classmethod
    def create(cls, world_size: int, rank: int, dp: int) -> Mesh:
        inner_groups, dp_groups = layout(world_size, dp)
        k = world_size // dp
        mine_inner: ProcessGroup | None = None
        mine_dp: ProcessGroup | None = None
        for ranks in inner_groups:
            g = new_group(ranks, timeout=group_timeout())
            if rank in ranks:
                mine_inner = g
        for ranks in dp_groups:
            g = new_group(ranks, timeout=group_timeout())
            if rank in ranks:
                mine_dp = g
        return cls(
            dp=dp,
            inner=k,
            dp_index=rank // k,
            inner_index=rank % k,
            inner_ranks=inner_groups[rank // k],
            dp_ranks=dp_groups[rank % k],
            inner_group=mine_inner,
            dp_group=mine_dp,
        )
