"""A user's data set, loss and metric on the command line: ``--dataset module:function``.

The function returns a ``torch.utils.data.Dataset`` (map-style: ``__len__`` and
``__getitem__``), or a ``(train, test)`` pair of them; samples are whatever the
user's ``collate_fn``-free DataLoader stacks: ``(inputs, target)`` pairs, dicts (a
Hugging Face model's ``input_ids``/``labels``), or tensors (:mod:`disttrain.batch`).
The trainer reads it through torch's DataLoader (``data/torchloader.py``), so the
global-batch rule holds as for the built-in sets. ``--loss module:function`` is
``loss_fn(output, target)``; without it a dict batch trains on the model's own
``output.loss`` and a pair on cross-entropy. ``--metric module:function`` is
``metric(output, target) -> float`` per test batch, averaged over the samples; the
default is accuracy where the targets are class indices, none otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import default_collate

from disttrain import batch as batches
from disttrain.comm.errors import UsageError
from disttrain.factories import load_callable

__all__ = ["UserData", "load_user_dataset", "load_user_function"]

BUILTINS = "digits, synthetic, pycode, a .npz path"


@dataclass(frozen=True)
class UserData:
    """A user's train and test sets (test may be None: no evaluation), by their spec."""

    name: str
    train: Any
    test: Any | None
    task: str = "user"

    @property
    def num_classes(self) -> int | None:
        return None  # a model factory asking for it is refused (models.FACTORY_ARGUMENTS)

    @property
    def in_features(self) -> int:
        inputs, _ = batches.inputs_and_target(self.sample(1))
        if not isinstance(inputs, torch.Tensor):
            raise UsageError(
                f"--dataset {self.name!r}: its inputs are a {type(inputs).__name__}, so a "
                "model factory cannot ask for in_features: build the model yourself"
            )
        return int(inputs[0].numel())

    def sample(self, n: int) -> Any:
        """The first ``n`` training samples as one batch (pre-flight's, the pipeline's)."""
        count = min(n, len(self.train))
        try:
            return default_collate([self.train[i] for i in range(count)])
        except Exception as exc:  # a structure that does not stack
            raise UsageError(
                f"--dataset {self.name!r}: its samples do not stack into a batch ({exc})"
            ) from None


def _is_dataset(value: Any) -> bool:
    return hasattr(value, "__len__") and hasattr(value, "__getitem__")


def load_user_dataset(spec: str) -> UserData:
    """The data set ``spec``'s function returns (one line if it is none)."""
    func = load_callable(spec, "--dataset", BUILTINS)
    try:
        made = func()
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"--dataset {spec!r}: {spec.partition(':')[2]}() raised {exc!r}") from None
    train, test = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    for part, value in (("train", train), ("test", test)):
        if value is not None and not _is_dataset(value):
            raise UsageError(
                f"--dataset {spec!r}: returned a {type(value).__name__} as its {part} set; "
                "return a torch Dataset (__len__, __getitem__) or a (train, test) pair"
            )
    if len(train) == 0:
        raise UsageError(f"--dataset {spec!r}: the training set is empty")
    return UserData(spec, train, test)


def load_user_function(spec: str, flag: str) -> Callable[..., Any]:
    """``--loss`` or ``--metric``'s function."""
    return load_callable(spec, flag, "module:function")
