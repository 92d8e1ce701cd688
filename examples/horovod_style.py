"""Horovod-style data parallelism: a plain PyTorch training script plus five disttrain lines.

    GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port 29511 examples/horovod_style.py --algorithm native --fusion-mb 25
    python examples/horovod_style.py                     # one process, same result

It trains the default MLP on scikit-learn's digits exactly as
``disttrain train --workers N --optimizer momentum`` does: the same initial
weights (seed), the same global batches (``--batch-size`` is the GLOBAL batch,
each rank takes its slice), the same averaged gradients. ``--uneven`` gives
rank r r fewer steps, to show ``opt.join()`` ending such a run cleanly.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F

import disttrain as dt
from disttrain.data import GlobalBatchSampler, load_dataset
from disttrain.models import mlp
from disttrain.models.mlp import DEFAULT_HIDDEN


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="native")
    parser.add_argument("--fusion-mb", type=float, default=25.0)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=0)
    parser.add_argument("--hidden", default=",".join(map(str, DEFAULT_HIDDEN)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--uneven", action="store_true")
    parser.add_argument("--out", default="", help="rank 0 saves the final state_dict here")
    args = parser.parse_args()

    dt.init()  # torchrun's environment, or a job of one process
    data = load_dataset("digits")
    torch.manual_seed(args.seed)  # as `disttrain train`: every rank builds the same model
    hidden = tuple(int(h) for h in args.hidden.split(","))
    model = mlp(data.in_features, data.num_classes, hidden)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    opt = dt.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        algorithm=args.algorithm,
        fusion_mb=args.fusion_mb,
        compression=None,
    )
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    dt.broadcast_optimizer_state(opt, root_rank=0)

    n, seed = len(data.x_train), args.seed
    sampler = GlobalBatchSampler(n, args.batch_size, dt.rank(), dt.size(), seed)
    max_steps = args.max_steps or sampler.steps_per_epoch * args.epochs
    if args.uneven:
        max_steps -= dt.rank()
    step, loss = 0, torch.zeros(())
    with opt.join():  # a rank that runs out of batches keeps the others going
        for epoch in range(args.epochs):
            for indices in sampler.epoch(epoch):
                if step >= max_steps:
                    break
                opt.zero_grad()
                loss = F.cross_entropy(model(data.x_train[indices]), data.y_train[indices])
                loss.backward()
                opt.step()
                step += 1
    if dt.rank() == 0:
        print(f"rank 0: {step} steps, last loss {loss.item():.4f}, world size {dt.size()}")
        if args.out:
            torch.save(model.state_dict(), args.out)
    dt.shutdown()


if __name__ == "__main__":
    main()
