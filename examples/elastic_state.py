"""Horovod-style elastic state: a job that loses a worker resumes from its last commit.

    GLOO_SOCKET_IFNAME=lo torchrun --nnodes 1 --nproc-per-node 2 --max-restarts 1 \
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29515 examples/elastic_state.py \
        --root state --kill-rank 1 --kill-epoch 2

(The c10d rendezvous: each restart round meets afresh. torchrun's static one,
``--master-addr``, keeps the first round's addresses in its store, and a restarted
worker may dial a dead peer.)

A small mlp on fixed random data, averaged by ``dt.DistributedOptimizer``; the model,
the optimizer and the epoch live in a ``dt.elastic.State`` committed after every epoch.
``--kill-rank R --kill-epoch E`` makes rank R kill itself in epoch E of the first round
(SIGKILL, as a lost machine): torchrun restarts every worker, each restores the last
commit and the job ends as if nothing had happened. Rank 0 writes the final parameters
(``--out FILE``, torch.save) and prints the epoch it resumed from.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch.nn import functional as F

import disttrain as dt
from disttrain.models import mlp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="elastic-state", help="where commits are kept")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=3)
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-epoch", type=int, default=-1)
    parser.add_argument("--out", default="", help="rank 0 saves the final parameters here")
    args = parser.parse_args()

    dt.init()
    torch.manual_seed(0)
    model = mlp(16, 4, (32,))
    opt = dt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    state = dt.elastic.State(model, opt, root=args.root, epoch=0)
    resumed = state.restore()  # after a restart: the last commit
    state.sync()  # every rank from rank 0's state
    first = state.epoch
    round_ = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for epoch in range(state.epoch, args.epochs):
        if round_ == 0 and dt.rank() == args.kill_rank and epoch == args.kill_epoch:
            os.kill(os.getpid(), signal.SIGKILL)
        gen = torch.Generator().manual_seed(1000 * epoch + dt.rank())  # an epoch's own data
        for _ in range(args.steps_per_epoch):
            x = torch.randn(8, 16, generator=gen)
            y = torch.randint(0, 4, (8,), generator=gen)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        state.epoch = epoch + 1
        state.commit()
    if dt.rank() == 0:
        print(f"round {round_}: resumed={resumed} from epoch {first}, ended at {state.epoch}")
        if args.out:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out)
    opt.close()
    dt.shutdown()


if __name__ == "__main__":
    main()
