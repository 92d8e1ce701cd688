"""Everything that can be checked before a worker starts (bad input: exit code 2)."""

from __future__ import annotations

from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["preflight"]


def preflight(cfg: Any) -> None:
    """Check everything that can be checked before a worker starts (exit 2 on failure)."""
    from disttrain import collectives, strategies
    from disttrain.data import load_dataset
    from disttrain.models import build_model
    from disttrain.train.faults import parse_fault

    tc = cfg.train
    strategy = strategies.get(tc.strategy)  # an unknown name: the registry's usage error
    if tc.algorithm not in collectives.ALGORITHMS:
        raise UsageError(
            f"unknown algorithm {tc.algorithm!r}: choose one of {', '.join(collectives.ALGORITHMS)}"
        )
    fault = parse_fault(tc.inject_fault)
    if fault and fault.rank >= tc.world_size:
        raise UsageError(
            f"--inject-fault names rank {fault.rank}, but there are {tc.world_size} workers"
        )
    if tc.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available on this machine")
    data = load_dataset(
        tc.dataset,
        tc.synthetic_size,
        tc.synthetic_dim,
        tc.synthetic_classes,
        tc.seq_len,
        tc.pycode_chars,
    )
    if len(data.x_train) < tc.batch_size:
        raise UsageError(
            f"--batch-size {tc.batch_size} is larger than the {len(data.x_train)} training samples"
        )
    model = build_model(tc.model, data, tc.seq_len)
    # Strategies check what needs the whole config (pipeline stages, mesh, ps modes) here.
    strategy.validate_config(cfg, model)
    if tc.resume:
        from disttrain import checkpoint

        checkpoint.load(tc.resume, 0, tc.world_size)  # ours, complete, same number of workers
