"""A user's loop that survives a killed worker: dt.distribute, a state saved every step,
resumed on any worker count (docs/your-loop.md, "Data, and resuming").

    disttrain run -np 2 python examples/resumable_loop.py --out runs/loop
    torchrun --nproc-per-node 4 examples/resumable_loop.py --out runs/loop   # goes on

``--stream`` reads the same samples as a stream of shards with a state (torchdata's
``Stateful`` protocol), ``--loader-workers`` DataLoader worker processes a rank; the
state then holds each loader worker's place in the stream, and a resume on another
layout re-cuts what is left of the epoch.

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
from torch.utils.data import Dataset, IterableDataset

import disttrain as dt

#: the stream's 12 shards, of uneven lengths, 96 samples in all
SHARDS = [4 + k * 5 % 9 for k in range(11)] + [11]


class Indexed(Dataset):
    """96 samples of 6 features and a target; each input carries its sample's id first."""

    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(6, generator=torch.Generator().manual_seed(i))
        return torch.cat([torch.tensor([float(i)]), x]), x.sum(0, keepdim=True)


class Shards(IterableDataset):
    """Indexed's samples as a stream of shards (as files would be), with torchdata's
    ``Stateful`` protocol: its place is the next (shard, offset) to read, kept as it
    reads; ``load_state_dict`` says where the next iteration begins."""

    def __init__(self) -> None:
        self.shard, self.offset = 0, 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        start, skip = self.shard, self.offset
        for shard in range(start, len(SHARDS)):
            for offset in range(skip if shard == start else 0, SHARDS[shard]):
                last = offset + 1 == SHARDS[shard]
                self.shard, self.offset = (shard + 1, 0) if last else (shard, offset + 1)
                yield Indexed()[sum(SHARDS[:shard]) + offset]
        self.shard, self.offset = 0, 0  # the next iteration is the next epoch's

    def state_dict(self) -> dict[str, int]:
        return {"shard": self.shard, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.shard, self.offset = int(state["shard"]), int(state["offset"])


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(x[:, 1:])  # the id is not a feature


def train(
    run: dt.DistributedRun, epochs: int, log: TextIO, state_file: str, stream: bool, workers: int
) -> None:
    """The loop, from where the run stands, saving its state after every step."""
    for epoch in range(run.epoch, epochs):
        data = Shards() if stream else Indexed()
        for inputs, target in run.loader(data, epoch=epoch, num_workers=workers):
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
    parser.add_argument("--stream", action="store_true")  # the samples as a stream of shards
    parser.add_argument("--loader-workers", type=int, default=0)  # DataLoader's num_workers
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Regressor()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run = dt.distribute(model, opt, args.strategy, batch_size=8, inject_fault=args.inject_fault)
    state_file = os.path.join(args.out, "state.pt")
    if os.path.exists(state_file):  # a restart: every rank goes on from the saved step
        run.load_state_dict(torch.load(state_file, weights_only=True))
    with open(os.path.join(args.out, f"trained-{dt.rank()}.txt"), "a") as log:
        train(run, args.epochs, log, state_file, args.stream, args.loader_workers)
    run.finish()


if __name__ == "__main__":
    main()
