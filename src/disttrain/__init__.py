"""disttrain: train PyTorch models with every classic distributed strategy, and measure each."""

from disttrain.comm.world import init, local_rank, rank, shutdown, size

__all__ = ["init", "local_rank", "rank", "shutdown", "size"]
__version__ = "0.1.0"
