"""L2: an optimizer that wraps another and hands it its state (param_groups, state, ...).

``dt.DistributedOptimizer`` and ``dt.ShardedOptimizer`` are both torch optimizers to
the user's code (schedulers, ``isinstance`` checks, checkpoints) while the state
lives in the optimizer they wrap: the full one, or the one over this rank's shards.
``Optimizer.__init__`` is not called by them, so every attribute a scheduler or a
checkpoint reads is handed through here, once.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["OptimizerWrapper"]


class OptimizerWrapper(torch.optim.Optimizer):
    """Hands ``param_groups``, ``state``, ``defaults`` and the state dicts to ``self.optimizer``."""

    optimizer: torch.optim.Optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict (a sharded one's: this rank's shard)."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` gave (a sharded one: on this rank, same ranks)."""
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
