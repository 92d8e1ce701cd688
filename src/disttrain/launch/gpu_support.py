"""The combinations proven to work on a GPU (``--device cuda``): pre-flight refuses the rest.

On NCCL every collective's tensors must live on the GPU, and parts of disttrain
still build CPU tensors for their collectives: the loss-scale agreement
(``amp.py``), ``--check-collectives``, ``--balance time``, ``join()`` and the
optimizer-state broadcast. gloo takes those, so ``--backend gloo`` (ranks sharing
one GPU) proves disttrain's own handling of GPU tensors but nothing of NCCL
(docs/gpu.md). So ``--device cuda`` is refused before any worker starts unless the
run's :class:`Combination` is in :data:`PROVEN`.

How a combination gets in: a passing run of ``tests/train/test_cuda.py`` (which
runs that combination) on a GPU machine, recorded in docs/gpu.md's "Proven
combinations" table (date, machine, test, commit); then one line here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disttrain.config import RunConfig

__all__ = ["PROVEN", "PROVING_ENV", "Combination", "combination", "unproven_reason"]


@dataclass(frozen=True)
class Combination:
    """What a run does on the device, as far as it decides which code paths talk to NCCL."""

    strategy: str
    algorithm: str
    compression: str
    precision: str
    check_collectives: bool
    #: more than one process: collectives between ranks (one process runs none)
    several: bool = False
    #: ``nccl`` (one GPU per rank) or ``gloo`` (``--backend gloo``: the ranks share one
    #: GPU, their collectives go through gloo and their point-to-point messages through
    #: the host; such a proof says nothing of NCCL)
    backend: str = "nccl"
    #: ``--compile``'s backend (``none``: eager, every row proven so far)
    compile: str = "none"

    def __str__(self) -> str:
        checks = " --check-collectives" if self.check_collectives else ""
        checks += f" --compile {self.compile}" if self.compile != "none" else ""
        if self.backend == "gloo":
            who = "(several ranks on one GPU, gloo)" if self.several else "(1 GPU, gloo)"
        else:
            who = "(several GPUs)" if self.several else "(1 GPU)"
        return (
            f"--strategy {self.strategy} --algorithm {self.algorithm} "
            f"--compression {self.compression} --precision {self.precision}{checks} {who}"
        )


#: Combinations a GPU run has proven: which run, machine and date proved each is docs/gpu.md's
#: "Proven combinations" (one home); add one only with its passing run recorded there.
_PRECISIONS = ("fp32", "bf16", "fp16")


def _shared(
    strategy: str,
    algorithm: str = "native",
    compression: str = "none",
    precision: str = "fp32",
    check: bool = False,
) -> Combination:
    """A combination proven with several ranks sharing one GPU over gloo (``--backend gloo``)."""
    return Combination(strategy, algorithm, compression, precision, check, True, "gloo")


#: one GPU, NCCL, one process (proven 2026-11-26, re-run 2026-11-27)
_ONE_GPU = [Combination("allreduce", "native", "none", p, False) for p in _PRECISIONS] + [
    Combination(s, "native", "none", p, False)
    for s in ("zero", "localsgd", "diloco")
    for p in _PRECISIONS
]
#: several ranks on one GPU over gloo (2026-11-27): every strategy in every precision, every
#: point-to-point algorithm, every codec and --check-collectives. Nothing here is NCCL.
_STRATEGIES = "allreduce decentralized localsgd diloco pipeline tensor hybrid ps zero"
_ALGORITHMS = "alltoall butterfly halving_doubling hierarchical ring roundrobin shm star tree"
_SHARED_GPU = (
    [_shared(s, precision=p) for s in _STRATEGIES.split() for p in _PRECISIONS]
    + [_shared("allreduce", algorithm=a) for a in _ALGORITHMS.split()]
    + [_shared("allreduce", compression=c) for c in ("fp16", "bf16", "onebit", "powersgd", "topk")]
    + [_shared("decentralized", compression="topk"), _shared("allreduce", check=True)]
)
PROVEN: frozenset[Combination] = frozenset(_ONE_GPU + _SHARED_GPU)


def combination(cfg: RunConfig) -> Combination:
    """The run's combination, from its settings."""
    from disttrain.compression.config import CompressionConfig

    tc = cfg.train
    return Combination(
        strategy=tc.strategy,
        algorithm=_algorithm(cfg),
        # the codec, not its ratio or rank: those change no device handling
        compression=cfg.section(CompressionConfig).compression.split(":", 1)[0],
        precision=tc.precision,
        check_collectives=bool(tc.check_collectives),
        several=tc.world_size > 1 or tc.live_grow,
        backend="gloo" if tc.backend == "gloo" else "nccl",
        compile=tc.compile,
    )


def _algorithm(cfg: RunConfig) -> str:
    """The algorithm that runs: ``auto``'s one, where its table (the launcher's on cuda,
    :data:`~disttrain.launch.autotable.OWN_TABLE`, or one given) names a single one."""
    from disttrain import collectives

    # auto without a table runs native (what the launcher's table on cuda, *:native, says)
    names = set(collectives.runs(cfg.train.algorithm, cfg))
    return names.pop() if len(names) == 1 else cfg.train.algorithm


#: Set on a GPU machine by ``make gpu-proof`` (``benchmarks/gpu_proof.sh``): pre-flight lets
#: every combination a one-GPU machine can run through, so that the proof can try it. Never
#: several NCCL ranks (they need a GPU each); never set by a user's run.
PROVING_ENV = "DISTTRAIN_PROVING_GPU"


def unproven_reason(cfg: RunConfig) -> str | None:
    """The one-line refusal for ``--device cuda`` with an unproven combination, or None."""
    combo = combination(cfg)
    if combo in PROVEN:
        return None
    if os.environ.get(PROVING_ENV) == "1" and not (combo.several and combo.backend == "nccl"):
        return None  # the proof is trying it (a GPU machine, make gpu-proof)
    proven = "; ".join(sorted(str(c) for c in PROVEN)) or "none yet"
    return (
        f"--device cuda: {combo} has not been proven on a GPU (proven: {proven}); see docs/gpu.md"
    )
