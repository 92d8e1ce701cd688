"""The environment our launcher hands its workers, named once for both sides (torch-free:
the command reads it before torch loads)."""

from __future__ import annotations

__all__ = ["WORKER_ENV"]

#: Set in every worker's environment: "run the training loop, do not launch".
WORKER_ENV = "DISTTRAIN_WORKER"
