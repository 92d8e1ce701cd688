"""disttrain: train PyTorch models with every classic distributed strategy, and measure each."""

from disttrain.comm.world import init, local_rank, rank, shutdown, size
from disttrain.dataparallel.broadcast import broadcast_optimizer_state, broadcast_parameters
from disttrain.optimizer import DistributedOptimizer

__all__ = [
    "DistributedOptimizer",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "init",
    "local_rank",
    "rank",
    "shutdown",
    "size",
]
__version__ = "0.1.0"
