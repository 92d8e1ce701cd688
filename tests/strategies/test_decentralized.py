"""Decentralized compressed SGD: identical replicas, the meter matching the stated sizes."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch

from tests import zygote
from tests.harness import SharedWorlds
from tests.strategies.test_localsgd import params, run, tiny_mlp


def _steps(flags: dict[str, Any], steps: int) -> tuple[list[float], int, dict[str, Any], float]:
    import torch.distributed as dist

    import disttrain.strategies  # noqa: F401  (registers the settings sections)
    from disttrain import config, strategies
    from disttrain.comm import meter, world
    from disttrain.train.trainer import loss_fn

    cfg = config.load({"workers": dist.get_world_size(), "batch_size": 48, **flags})
    torch.manual_seed(0)
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    strategy = strategies.get("decentralized").build(cfg, world.current(), loss_fn)
    strategy.setup(model, optimizer)
    meter.reset()
    gen = torch.Generator().manual_seed(dist.get_rank())
    first = last = 0.0
    for step in range(1, steps + 1):
        x, y = torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        x = x + y[:, None].float()  # learnable: the class shifts the input
        optimizer.zero_grad()
        loss = float(strategy.forward_backward(x, y))
        first = loss if step == 1 else first
        last = loss
        strategy.after_backward()
        optimizer.step()
        strategy.after_step(step)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return flat.tolist(), meter.bytes_sent, strategy.summary(), last - first


def _dense_ring_bytes(numel: int, times: int) -> int:
    """The meter's bytes for ``times`` dense fp32 ring allreduces of ``numel`` entries."""
    from disttrain import collectives
    from disttrain.comm import meter

    collectives.set_length_check(False)
    meter.reset()
    for _ in range(times):
        collectives.all_reduce(torch.ones(numel), "ring")
    return meter.bytes_sent


SPECS = ("onebit:0.01", "topk:0.05")
NUMEL = sum(p.numel() for p in tiny_mlp().parameters())
GOSSIP = {"compression": "topk:0.1", "topology": "ring", "consensus_step": 0.5}
#: the runs of this file in one world per size (2 spawns instead of 6: a spawn's start-up
#: costs more than a run; each builds its own model, seeds and resets the meter). The
#: independent counts on 3 ranks: the meter of an uncompressed all-peers run (fp32 to
#: every peer) and of dense ring allreduces of the same gradient, as many as the steps;
#: the ring's last, as it turns the collectives' length check off for its process.
RUNS = SharedWorlds(
    {
        **{spec: (3, _steps, ({"compression": spec}, 15)) for spec in SPECS},
        "dense": (3, _steps, ({"compression": "none"}, 15)),
        "ring": (3, _dense_ring_bytes, (NUMEL, 15)),
        "gossip": (4, _steps, (GOSSIP, 12)),
        "alone": (4, _steps, ({**GOSSIP, "consensus_step": 1e-6}, 12)),
    },
    timeout=240,
)


@pytest.mark.timeout(300)  # the first test runs the world of 3 ranks
@pytest.mark.parametrize("spec", SPECS)
def test_all_peers_replicas_stay_identical_and_meter_matches_claim(spec: str) -> None:
    results = RUNS.get(spec)
    reference = results[0][0]
    dense, ring = RUNS.get("dense"), RUNS.get("ring")
    assert len(dense[0][0]) == NUMEL  # the ring summed tensors of the gradient's size
    for rank, (flat, metered, summary, _) in enumerate(results):
        assert flat == reference  # bit-identical: decoded payloads summed in rank order
        assert metered == summary["claimed_wire_bytes_per_rank"] > 0
        assert metered == summary["compressed_bytes_per_rank"]
        # the two ratios against what the meter counted in the dense runs, rank by rank
        assert summary["payload_compression"] == pytest.approx(dense[rank][1] / metered)
        assert summary["bytes_vs_dense_allreduce"] == pytest.approx(ring[rank] / metered, rel=0.01)
        # on 3 ranks an fp32 payload to each peer is 2 S, a ring allreduce 4/3 S
        assert summary["payload_compression"] == pytest.approx(
            1.5 * summary["bytes_vs_dense_allreduce"], rel=0.01
        )
    if spec.startswith("onebit"):
        s = results[0][2]
        assert s["payload_compression"] > 10
        assert s["entropy_bits_per_sent_entry"] <= s["bits_per_sent_entry"]


def _spread(results: list[Any]) -> float:
    flats = torch.tensor([r[0] for r in results])
    return float((flats - flats.mean(0)).abs().max())


@pytest.mark.timeout(300)  # it runs the world of 4 ranks
def test_ring_gossip_meters_two_neighbours_and_pulls_replicas_together() -> None:
    results, alone = RUNS.get("gossip"), RUNS.get("alone")
    # replicas differ on a ring, but gossip keeps them far closer than no mixing does
    assert 0 < _spread(results) < 0.5 * _spread(alone)
    n = len(results[0][0])
    for _, metered, summary, _ in results:
        assert summary["topology"] == "ring"
        assert metered == summary["claimed_wire_bytes_per_rank"] > 0
        assert summary["dense_fp32_bytes_per_rank"] == 2 * 12 * 4 * n  # two neighbours


def test_uncompressed_all_peers_equals_synchronous_allreduce(tmp_path: Any) -> None:
    sync_summary, sync = run(str(tmp_path), "sync", strategy="allreduce")
    summary, dec = run(str(tmp_path), "dec", strategy="decentralized", compression="none")
    torch.testing.assert_close(params(dec), params(sync), rtol=0, atol=1e-5)
    # fp32 payloads: as many bytes as the dense exchange; on 2 ranks the one peer gets S,
    # as in the synchronous run's allreduce (the meter's bytes, compared)
    assert summary["payload_compression"] == 1.0
    assert summary["bytes_vs_dense_allreduce"] == pytest.approx(
        sync_summary["bytes_sent_by_rank"][0] / summary["compressed_bytes_per_rank"], rel=0.01
    )
    with open(os.path.join(dec, "metrics.jsonl")) as fh:
        steps = [json.loads(line) for line in fh if '"loss"' in line]
    assert len(steps) == 12
    assert all(s["payload_compression"] == 1.0 and s["residual_norm"] == 0.0 for s in steps)


def test_bad_settings_are_usage_errors() -> None:
    import disttrain.strategies  # noqa: F401
    from disttrain import config
    from disttrain.comm.errors import UsageError

    with pytest.raises(UsageError, match="--compression"):
        config.load({"strategy": "decentralized", "compression": "onebit:0"})
    with pytest.raises(UsageError, match="--consensus-step"):
        config.load({"strategy": "decentralized", "consensus_step": 0.0})


@pytest.mark.parametrize(
    "flags",
    [
        ["--strategy", "decentralized", "--compression", "onebit:-1"],
        ["--strategy", "localsgd", "--period", "0"],
    ],
)
def test_cli_bad_flags_exit_2_with_one_line(flags: list[str]) -> None:
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = zygote.run(
        [sys.executable, "-m", "disttrain", "train", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "error" in proc.stderr
