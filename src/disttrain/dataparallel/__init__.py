"""L2: the shared mechanics of data parallelism, used by every strategy that averages.

``fusion.py`` (gradient buckets; the thread that runs collectives off the training
thread is ``comm/commthread.py``), ``reducer.py`` (buckets reduced during backward),
``average.py`` (flatten → allreduce → divide → copy back, written once),
``broadcast.py`` (parameters and optimizer state from one rank),
``ddp_hooks.py`` (any allreduce algorithm as a PyTorch DDP communication hook).
"""
