"""A worker of tests/horovod/test_elastic.py's killed-worker test, run by
``torchrun --max-restarts 1`` on 2 processes: ``hvd.elastic.run`` trains a linear model
for STEPS steps, committing every second step. In round 0, rank 1 stops after step
KILL_AT (step KILL_AT - 1 committed, one step past it) and waits for the test's SIGKILL.

Each round starts from another random model (seeded by the round), so only a restored
commit can match an undisturbed run. Written under OUT: ``pid-<round>-<rank>`` (every
process, at its start), ``commit-<step>.pt`` (rank 0 of round 0, each commit's
parameters), ``kill-me`` (rank 1's pid) and ``rank<r>.pt`` (what each rank ended with).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import disttrain.horovod as hvd

STEPS = 8
KILL_AT = 5


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each step's and rank's data: the same in every round."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 4, generator=g), torch.randn(6, 1, generator=g)


def params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def _write(path: Path, text: str) -> None:
    path.with_suffix(".tmp").write_text(text)
    path.with_suffix(".tmp").replace(path)  # whole, for the test polling it


def main(out: Path) -> None:
    hvd.init()
    rank, rnd = hvd.rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    _write(out / f"pid-{rnd}-{rank}", str(os.getpid()))
    torch.manual_seed(10 * rnd + rank)
    model = torch.nn.Linear(4, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, step=0, done=[])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> tuple[int, torch.Tensor]:
        start = (state.step, params(model))
        while state.step < STEPS:
            x, y = batch(state.step, rank)
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
            state.step += 1
            state.done.append(state.step)  # a plain value, rolled back with the rest
            if state.step % 2 == 0:
                state.commit()
                if rnd == 0 and rank == 0:
                    torch.save(params(model), out / f"commit-{state.step}.pt")
            if rnd == 0 and rank == 1 and state.step == KILL_AT:
                _write(out / "kill-me", str(os.getpid()))
                time.sleep(60)  # the test kills this process here
        return start

    start_step, start_params = train(state)
    momentum = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    result = {"round": rnd, "start_step": start_step, "start_params": start_params}
    result.update(params=params(model), momentum=momentum, done=state.done, step=state.step)
    torch.save(result, out / f"rank{rank}.pt")
    hvd.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
