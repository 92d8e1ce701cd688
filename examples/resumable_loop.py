"""A user's loop that survives a killed worker: dt.distribute, a state saved every step,
resumed on any worker count (docs/your-loop.md, "Data, and resuming").

    disttrain run -np 2 python examples/resumable_loop.py --out runs/loop
    torchrun --nproc-per-node 4 examples/resumable_loop.py --out runs/loop   # goes on

Each rank appends the samples it trained to OUT/trained-RANK.txt (``epoch step id``), so
a test can count that every sample of an epoch was trained exactly once across a kill.
"""

from __future__ import annotations

import argparse
import os
from typing import TextIO

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

import disttrain as dt


class Indexed(Dataset):
    """96 samples of 6 features and a target; each input carries its sample's id first."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(6, generator=torch.Generator().manual_seed(i))
        return torch.cat([torch.tensor([float(i)]), x]), x.sum(0, keepdim=True)


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x[:, 1:])  # the id is not a feature


def train(run: dt.DistributedRun, epochs: int, log: TextIO, state_file: str) -> None:
    """The loop, from where the run stands, saving its state after every step."""
    for epoch in range(run.epoch, epochs):
        for inputs, target in run.loader(Indexed(), epoch=epoch):
            run.step((inputs, target), F.mse_loss)
            log.writelines(f"{epoch} {run.steps} {int(i)}\n" for i in inputs[:, 0])
            log.flush()
            state = run.state_dict()  # every rank: its part travels to the others
            if dt.rank() == 0:
                torch.save(state, state_file + ".tmp")
                os.replace(state_file + ".tmp", state_file)  # a kill leaves a whole file


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--strategy", default="allreduce")
    parser.add_argument("--inject-fault", default="")  # e.g. kill:rank=1:step=5
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run = dt.distribute(model, opt, args.strategy, batch_size=8, inject_fault=args.inject_fault)
    state_file = os.path.join(args.out, "state.pt")
    if os.path.exists(state_file):  # a restart: every rank goes on from the saved step
        run.load_state_dict(torch.load(state_file, weights_only=True))
    with open(os.path.join(args.out, f"trained-{dt.rank()}.txt"), "a") as log:
        train(run, args.epochs, log, state_file)
    run.finish()


if __name__ == "__main__":
    main()
