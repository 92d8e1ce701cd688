"""A sparse compressor that sends almost nothing says so, once, early in the run.

``--compression onebit:0.5`` on the default run sends 402 bytes in all (no accumulated
gradient entry ever passes a threshold of 0.5) and stays at 0.10 accuracy: a silent
failure. After :data:`WINDOW` exchanges (one a step for the strategies that send sparse
payloads) rank 0 compares the entries sent with the compressor's nominal share
(``SparseCompressor.nominal_share``: top-k's ratio; one-bit's is set by the data, so the
share its recommended threshold sent on the default run, 1e-5). Under :data:`FLOOR` of it,
one ``warning:`` line names the compressor, what it sent and its kind's default, a setting
that trains.
"""

from __future__ import annotations

import sys

import torch.distributed as dist

from disttrain.compression.base import COMPRESSORS, Payload, SparseCompressor

__all__ = ["FLOOR", "WINDOW", "StarvedCheck"]

WINDOW = 20  # exchanges counted before the verdict
FLOOR = 0.01  # of the nominal share: "almost nothing"


class StarvedCheck:
    """Counts the entries a sparse compressor sends; warns once if they are almost none."""

    def __init__(self, compressor: object) -> None:
        self.compressor = compressor if isinstance(compressor, SparseCompressor) else None
        self.entries = self.numel = self.exchanges = 0

    def count(self, payload: Payload) -> None:
        """One exchange's payload; after :data:`WINDOW` of them, the verdict (once)."""
        if self.compressor is None or self.exchanges >= WINDOW:
            return
        self.entries += int(self.compressor.entries(payload)[0].size)
        self.numel += payload.numel
        self.exchanges += 1
        if self.exchanges == WINDOW:
            line = self.verdict()
            if line and (not dist.is_initialized() or dist.get_rank() == 0):
                print(line, file=sys.stderr, flush=True)

    def verdict(self) -> str | None:
        """The warning line, or None if the compressor sent at least FLOOR of its share."""
        c = self.compressor
        if c is None or not self.numel:
            return None
        share = c.nominal_share
        sent = self.entries / self.numel
        if sent >= FLOOR * share:
            return None
        default = COMPRESSORS.get(c.name).default
        return (
            f"warning: --compression {c.spec} sent {self.entries:,} of {self.numel:,} gradient "
            f"entries in its first {self.exchanges} exchanges ({sent:.2g}, under {FLOOR:.0%} of "
            f"its nominal share {share:g}): the model barely changes; try --compression "
            f"{c.name}:{default}"
        )
