"""L2: the shared mechanics of data parallelism, used by every strategy that averages.

``fusion.py`` (gradient buckets), ``reducer.py`` (buckets reduced during backward, on
``comm/commthread.py``'s thread),
``average.py`` (flatten → allreduce → divide → copy back, written once),
``broadcast.py`` (parameters and optimizer state from one rank),
``buffers.py`` (which buffers replicas keep equal: rank 0's broadcast, or averaged),
``ddp_hooks.py`` (any allreduce algorithm as a PyTorch DDP communication hook).
"""
