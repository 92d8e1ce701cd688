"""L1: data sets and the global-batch distributed sampler."""

from disttrain.data.datasets import Dataset, load_dataset
from disttrain.data.sampler import GlobalBatchSampler

__all__ = ["Dataset", "GlobalBatchSampler", "load_dataset"]
