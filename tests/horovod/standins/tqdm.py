"""A stand-in for tqdm (not installed here), for Horovod's ImageNet example: the progress
bar it opens per epoch, printed once when it closes (rank 0 only: the others disable it)."""

from __future__ import annotations

from typing import Any

__all__ = ["tqdm"]


class tqdm:  # lower case: tqdm's own name
    def __init__(self, total: int | None = None, desc: str = "", disable: bool = False) -> None:
        self.total, self.desc, self.disable = total, desc, disable
        self.n = 0
        self.postfix: dict[str, Any] = {}

    def __enter__(self) -> tqdm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_postfix(self, postfix: dict[str, Any]) -> None:
        self.postfix = dict(postfix)

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        if not self.disable:
            shown = ", ".join(f"{k}={v:.3g}" for k, v in self.postfix.items())
            print(f"{self.desc}: {self.n}/{self.total} [{shown}]", flush=True)
