"""The ring's segment size: each size given against native and one message per chunk, interleaved.

    disttrain bench ring-segments --workers 2 --sizes 64MB --segments 256KB,1MB,4MB,16MB --iters 10

The ring cuts each chunk into segments of about ``--segments`` bytes and
forwards each one as soon as it is summed (docs/collectives.md, "Segment
pipelining"). For every segment size S given, a variant ``ring_seg_S`` is
registered for this run only, here and in every rank
(:class:`~disttrain.lab.bench._variants.InRanks`), and ``ring_seg_none`` sends
each chunk as one message. Each variant sets the process-wide segment size
around its own call and its ``cost()``, so all of them can run in the same
interleaved rounds as native and meter == cost still holds. The default segment
(``chunks.segment_bytes()``) rests on this comparison. Every other flag is
``disttrain bench allreduce``'s; the table is its table (read the "paired"
column: time over native's in the same round).
"""

from __future__ import annotations

import argparse

from disttrain.comm.errors import UsageError
from disttrain.lab.bench import allreduce as bench_allreduce
from disttrain.lab.bench._variants import InRanks

__all__ = ["add_arguments", "run", "variant_names"]

#: "none": one message per chunk (a segment larger than any tensor).
UNSEGMENTED = 1 << 62


def _parse(segments: str) -> list[tuple[str, int]]:
    """``"1MB,none"`` -> ``[("1MB", 1 << 20), ("none", UNSEGMENTED)]``; raises UsageError."""
    out = []
    for text in (t.strip() for t in segments.split(",")):
        if not text:
            continue
        if text.lower() == "none":
            out.append(("none", UNSEGMENTED))
        else:
            try:
                out.append((text.upper(), bench_allreduce.parse_size(text)))
            except UsageError:
                raise UsageError(
                    f"--segments: cannot read {text!r}; write e.g. 1MB,4MB,none"
                ) from None
    if not out:
        raise UsageError("--segments: give at least one size (or none)")
    return out


def variant_names(segments: str) -> list[str]:
    return [f"ring_seg_{label}" for label, _ in _parse(segments)]


def _register(segments: str) -> None:
    from dataclasses import replace

    import torch
    from torch.distributed import ProcessGroup

    from disttrain.collectives import chunks
    from disttrain.collectives.base import ALGORITHMS, Cost, Op, register
    from disttrain.collectives.ring import Ring

    def variant(label: str, nbytes: int) -> type[Ring]:
        class Segmented(Ring):
            name = f"ring_seg_{label}"

            def reduce_flat(self, flat: torch.Tensor, group: ProcessGroup | None) -> None:
                old = chunks.set_segment_bytes(nbytes)
                try:
                    super().reduce_flat(flat, group)
                finally:
                    chunks.set_segment_bytes(old)

            def cost(
                self,
                nbytes_: int,
                world_size: int,
                rank: int = 0,
                itemsize: int = 1,
                op: Op = "all_reduce",
            ) -> Cost:
                old = chunks.set_segment_bytes(nbytes)
                try:
                    return super().cost(nbytes_, world_size, rank, itemsize, op)
                finally:
                    chunks.set_segment_bytes(old)

        return Segmented

    for label, nbytes in _parse(segments):
        register(replace(ALGORITHMS.get("ring"), runtime=variant(label, nbytes)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    bench_allreduce.add_arguments(parser)
    parser.add_argument(
        "--segments",
        default="256KB,1MB,4MB,16MB",
        help="segment sizes to compare, comma-separated (default: 256KB,1MB,4MB,16MB); "
        "one message per chunk is always added",
    )
    parser.set_defaults(sizes="64MB", algorithms="")


def run(args: argparse.Namespace) -> int:
    segments = f"{args.segments},none"
    names = variant_names(segments)
    args.variants = InRanks(_register, segments)
    given: str = args.algorithms
    if given.strip() != "all":  # --algorithms adds to the variants; all already holds them
        args.algorithms = ",".join(["native", *names, *[a for a in given.split(",") if a.strip()]])
    return bench_allreduce.run(args)
