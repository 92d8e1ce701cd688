"""ZeRO from a plain PyTorch script: dt.shard_model + dt.ShardedOptimizer, then one full state_dict.

    GLOO_SOCKET_IFNAME=lo torchrun --nproc-per-node 2 --master-addr 127.0.0.1 \
        --master-port 29512 examples/sharded_zero.py --stage 3 --out model.pt
    python examples/sharded_zero.py                      # one process, same result

Each rank keeps 1/N of the Adam state (stage 1), of the gradients (stage 2) and
of the weights (stage 3: each layer gathered only while it computes), and the
steps are those of one process at the same global batch (``--batch-size`` is
the GLOBAL batch, each rank takes its slice). At the end rank 0 gathers the
whole model's and the whole optimizer's state_dict and saves them; they load
into the plain ``mlp`` and a plain ``torch.optim.Adam`` over it.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F

import disttrain as dt
from disttrain.data import GlobalBatchSampler, load_dataset
from disttrain.models import mlp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, choices=(1, 2, 3), default=3)
    parser.add_argument("--algorithm", default="native")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="rank 0 saves {model, optimizer} here")
    args = parser.parse_args()

    dt.init()  # torchrun's environment, or a job of one process
    data = load_dataset("digits")
    torch.manual_seed(args.seed)
    hidden = tuple(int(h) for h in args.hidden.split(","))
    model = mlp(data.in_features, data.num_classes, hidden)
    if args.stage == 3:
        model = dt.shard_model(model, algorithm=args.algorithm)
    opt = dt.ShardedOptimizer(
        model.parameters(),
        torch.optim.Adam,
        lr=args.lr,
        algorithm=args.algorithm,
        **({} if args.stage == 3 else {"stage": args.stage}),
    )

    sampler = GlobalBatchSampler(
        len(data.x_train), args.batch_size, dt.rank(), dt.size(), args.seed
    )
    step, loss = 0, torch.zeros(())
    for epoch in range(args.max_steps // sampler.steps_per_epoch + 1):
        for indices in sampler.epoch(epoch)[: args.max_steps - step]:
            opt.zero_grad()
            loss = F.cross_entropy(model(data.x_train[indices]), data.y_train[indices])
            loss.backward()
            opt.step()
            step += 1

    # collectives: every rank takes part, rank 0 gets the whole state
    full_model = model.full_state_dict() if args.stage == 3 else model.state_dict()
    full_optimizer = opt.full_state_dict()
    if dt.rank() == 0:
        print(
            f"rank 0: {step} steps, last loss {loss.item():.4f}, world size {dt.size()}, "
            f"stage {args.stage}"
        )
        if args.out:
            torch.save({"model": full_model, "optimizer": full_optimizer}, args.out)
    opt.close()
    dt.shutdown()


if __name__ == "__main__":
    main()
