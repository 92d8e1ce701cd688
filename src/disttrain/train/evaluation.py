"""The loss every strategy trains on, and the test-set evaluation on rank 0."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from disttrain import strategies
from disttrain.comm.meter import meter
from disttrain.data import Dataset

__all__ = ["epoch_end", "evaluate", "gather_floats", "loss_fn"]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy, over classes or (for language models) over every position."""
    if output.dim() == 3:
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
    return F.cross_entropy(output, target)


@torch.no_grad()
def evaluate(
    model: nn.Module, data: Dataset, device: torch.device, batch: int = 512
) -> tuple[float, float | None]:
    """Mean test loss, and accuracy (None for language models)."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for i in range(0, len(data.x_test), batch):
        x = data.x_test[i : i + batch].to(device)
        y = data.y_test[i : i + batch].to(device)
        out = model(x)
        total_loss += loss_fn(out, y).item() * len(x)
        if data.task == "classification":
            correct += int((out.argmax(dim=1) == y).sum())
        count += len(x)
    model.train()
    return total_loss / count, (correct / count if data.task == "classification" else None)


def epoch_end(
    strategy: strategies.Strategy,
    evaluate_on: Callable[[nn.Module, torch.device], tuple[float, float | None]],
    device: torch.device,
) -> tuple[nn.Module | None, float, float | None]:
    """Evaluate the whole model on rank 0 (gathering it if the strategy splits it)."""
    with meter.paused():
        model = strategy.eval_model()
    if model is None:
        return None, float("nan"), None
    # a split strategy's whole model on rank 0 holds the other ranks' parts as received
    # (on the host): evaluated on the run's device (a no-op for the parts already there)
    return model, *evaluate_on(model.to(device), device)


def gather_floats(
    values: list[float], device: torch.device, group: dist.ProcessGroup | None
) -> list[list[float]]:
    """Every worker's ``values`` (end-of-run bookkeeping, outside the measured traffic)."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    n = dist.get_world_size(group)
    if n == 1:
        return [mine.tolist()]
    out = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(out, mine, group=group)
    return [t.tolist() for t in out]
