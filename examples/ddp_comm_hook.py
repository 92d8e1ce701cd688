"""Try a disttrain allreduce algorithm without leaving PyTorch DDP: a communication hook.

    GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port 29512 examples/ddp_comm_hook.py --algorithm native

DDP still buckets the gradients and overlaps with backward; only the sum of
each bucket is done by the named algorithm (``disttrain.collectives.ALGORITHMS``).
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import disttrain as dt
from disttrain.data import GlobalBatchSampler, load_dataset
from disttrain.dataparallel.ddp_hooks import AlgorithmHook, allreduce_hook
from disttrain.models import mlp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="native")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dt.init()
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = DDP(mlp(data.in_features, data.num_classes))
    model.register_comm_hook(AlgorithmHook(args.algorithm), allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = GlobalBatchSampler(len(data.x_train), args.batch_size, dt.rank(), dt.size())
    loss = torch.zeros(())
    for indices in sampler.epoch(0)[: args.steps]:
        opt.zero_grad()
        loss = F.cross_entropy(model(data.x_train[indices]), data.y_train[indices])
        loss.backward()
        opt.step()
    if dt.rank() == 0:
        print(f"{args.algorithm}: {args.steps} steps, last loss {loss.item():.4f}")
    dt.shutdown()


if __name__ == "__main__":
    main()
