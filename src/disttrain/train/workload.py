"""What a run trains on: its batches, loss, metric and test-set evaluation.

A built-in data set (:class:`~disttrain.data.Dataset`: in-memory tensors) is read by the
prefetching slice loader, as before; a user's (``--dataset module:function``,
:class:`~disttrain.data.user.UserData`) by torch's own DataLoader over this rank's share
of each global batch (``data/torchloader.py``). Both yield ``(x, y)`` as strategies take
them (:mod:`disttrain.batch`). ``--loss`` and ``--metric`` name the user's functions;
the defaults are cross-entropy (a dict batch: the model's own ``output.loss``) and
accuracy where the targets are class indices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from disttrain import batch as batches
from disttrain.config import DataConfig
from disttrain.data.loader import BatchLoader
from disttrain.data.user import UserData, load_user_function
from disttrain.train.evaluation import loss_fn as cross_entropy

__all__ = ["Workload"]

Metric = Callable[[Any, Any], float]


def _accuracy(output: Any, target: Any) -> float | None:
    """The share of argmax hits where the targets are class indices, else None."""
    logits = getattr(output, "logits", output)
    labels = target.get("labels") if isinstance(target, dict) else target
    if not (isinstance(logits, torch.Tensor) and isinstance(labels, torch.Tensor)):
        return None
    if labels.dtype != torch.int64 or logits.dim() != 2 or labels.shape != logits.shape[:1]:
        return None
    return float((logits.argmax(dim=1) == labels).float().mean())


class Workload:
    """One run's data set with its loss and metric (``cfg.data``'s ``--dataset``, ``--loss``,
    ``--metric``)."""

    def __init__(self, cfg: DataConfig, data: Any) -> None:
        self.data = data
        self.user = isinstance(data, UserData)
        own = load_user_function(cfg.loss, "--loss") if cfg.loss else None
        self.metric: Metric | None = (
            load_user_function(cfg.metric, "--metric") if cfg.metric else None
        )
        #: what the loss is, for messages
        self.loss_name = f"--loss {cfg.loss}" if own else "cross-entropy"
        if own is not None:
            self.loss: batches.LossFn = lambda out, y: batches.checked_loss(own(out, y))
        elif self.user and not isinstance(shape := self.data.sample(1), (tuple, list)):
            self.loss_name = "the model's own output.loss"
            self.loss = batches.loss_for(shape, None)
        else:
            self.loss = cross_entropy

    @property
    def train_samples(self) -> int:
        return len(self.data.train) if self.user else len(self.data.x_train)

    def sample_inputs(self, n: int) -> Any:
        """The inputs of the first ``n`` training samples (what ``--balance time`` times)."""
        if self.user:
            return batches.inputs_and_target(self.data.sample(n))[0]
        return self.data.x_train[:n]

    def loader(self, plan: dict[str, Any], device: torch.device) -> Any:
        """This rank's ``(x, y)`` batches of ``plan['epoch']`` from ``plan['skip']`` on, at most
        ``plan['limit']`` of them; ``.wait_seconds``: the training thread's wait for them."""
        if not self.user:
            shards = plan["shards"][plan["skip"] : plan["skip"] + plan["limit"]]
            x, y = self.data.x_train, self.data.y_train
            return BatchLoader(x, y, shards, device, plan["prefetch"], delay_seconds=plan["delay"])
        return _UserBatches(self.data.train, plan, device)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device) -> tuple[float, float | None]:
        """Mean test loss, and the metric (None where it does not apply); NaN without a
        test set."""
        if not self.user and self.metric is None and self.loss is cross_entropy:
            from disttrain.train.evaluation import evaluate

            return evaluate(model, self.data, device)
        test = self.data.test if self.user else _pairs(self.data.x_test, self.data.y_test)
        return _evaluate(model, test, self.loss, self.metric, device)


def _pairs(x: torch.Tensor, y: torch.Tensor) -> Any:
    from torch.utils.data import TensorDataset

    return TensorDataset(x, y)


def _evaluate(
    model: nn.Module, test: Any, loss: batches.LossFn, metric: Metric | None, device: torch.device
) -> tuple[float, float | None]:
    from torch.utils.data import DataLoader

    if test is None or len(test) == 0:
        return float("nan"), None
    model.eval()
    total, scored, count, hits = 0.0, 0.0, 0, 0
    for batch in DataLoader(test, batch_size=256):
        batch = batches.to_device(batch, device)
        x, y = batches.inputs_and_target(batch)
        out = batches.call_model(model, x)
        n = batches.num_samples(x)
        total += float(loss(out, y)) * n
        score = metric(out, y) if metric is not None else _accuracy(out, y)
        if score is not None:
            scored, hits = scored + float(score) * n, hits + n
        count += n
    model.train()
    return total / count, (scored / hits if hits == count else None)


class _UserBatches:
    """torch's DataLoader over this rank's share, as ``(x, y)`` on the device."""

    def __init__(self, train: Any, plan: dict[str, Any], device: torch.device) -> None:
        from disttrain.data.torchloader import rank_loader

        self.loader = rank_loader(
            train, plan["global_batch"], plan["rank"], plan["world"],
            epoch=plan["epoch"], seed=plan["seed"], skip=plan["skip"],
            num_workers=plan["workers"],
        )  # fmt: skip
        self.limit, self.device = plan["limit"], device
        self.wait_seconds = 0.0

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        it = iter(self.loader)
        for _ in range(min(self.limit, len(self.loader))):
            start = time.perf_counter()
            batch = batches.to_device(next(it), self.device)
            self.wait_seconds += time.perf_counter() - start
            yield batches.inputs_and_target(batch)
