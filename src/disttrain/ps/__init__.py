"""L2: parameter servers: wire protocol, servers, worker client, consistency modes, sharding."""

from disttrain.ps.consistency import MODES, Consistency, staleness_lr_scale
from disttrain.ps.sharding import shard_bounds

__all__ = ["MODES", "Consistency", "shard_bounds", "staleness_lr_scale"]
