"""DiLoCo: H = 1 with plain outer SGD is local SGD; the outer Nesterov step matches a hand-written
reference; streaming fragments cover every parameter once and cut the peak bytes per step."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from disttrain import config
from disttrain.strategies.diloco import fragments
from tests.harness import run_world
from tests.strategies.test_localsgd import params, tiny_mlp


def run(tmp: str, name: str, **flags: Any) -> tuple[dict[str, Any], str]:
    """test_localsgd's in-process run, with a timeout for a loaded machine."""
    import os

    from tests.strategies.test_localsgd import _train

    out = os.path.join(tmp, name)
    base = {
        "workers": 2,
        "model": "tests.strategies.test_diloco:tiny_mlp",
        "epochs": 1,
        "max_steps": 12,
        "batch_size": 32,
        "lr": 0.1,
        "progress": False,
        "out": out,
    }
    return run_world(_train, 2, args=({**base, **flags},), timeout=300)[0], out


__all__ = ["tiny_mlp"]


def test_strategy_default_optimizer_is_adam_and_a_given_flag_wins() -> None:
    assert config.load({"strategy": "diloco"}).train.optimizer == "adam"
    assert config.load({"strategy": "diloco"}).train.lr == 0.003
    assert config.load({"strategy": "diloco", "optimizer": "sgd"}).train.optimizer == "sgd"
    assert config.load({}).train.optimizer == "momentum"  # other strategies keep theirs


@pytest.mark.parametrize(
    "sizes,count",
    [
        ([10, 1, 10, 1, 10, 1, 10, 1], 4),
        ([5, 5], 2),
        ([100, 1, 1, 1], 3),
        ([1, 1, 1, 100], 2),
        ([7] * 13, 5),
        ([3, 900, 2, 2, 2, 400, 1], 4),
    ],
)
def test_fragments_cover_every_parameter_exactly_once(sizes: list[int], count: int) -> None:
    parts = fragments(sizes, count)
    assert len(parts) == count and all(parts)
    assert sorted(i for part in parts for i in part) == list(range(len(sizes)))
    assert [i for part in parts for i in part] == list(range(len(sizes)))  # contiguous, in order


@pytest.mark.timeout(600)  # two short runs (process start-up dominates on a loaded machine)
def test_period_one_plain_outer_sgd_equals_local_sgd(tmp_path: Any) -> None:
    # outer lr 1, no momentum: θ - mean(θ - θ_w) = mean(θ_w), local SGD's average (fp32 rounding)
    inner = {"period": 1, "optimizer": "sgd"}
    _, local = run(str(tmp_path), "local", strategy="localsgd", **inner)
    summary, diloco = run(
        str(tmp_path), "diloco", strategy="diloco", outer_lr=1.0, outer_momentum=0.0, **inner
    )
    torch.testing.assert_close(params(diloco), params(local), rtol=0, atol=1e-5)
    assert summary["outer_steps"] == [12]


def _two_outer_steps(lr: float, m: float) -> float:
    import torch.distributed as dist

    from disttrain import strategies
    from disttrain.comm import world
    from disttrain.train.trainer import loss_fn

    rank, n = dist.get_rank(), dist.get_world_size()
    cfg = config.load(
        {"strategy": "diloco", "workers": n, "period": 2, "outer_lr": lr, "outer_momentum": m}
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    strategy = strategies.get("diloco").build(cfg, world.current(), loss_fn)
    strategy.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
    buf = torch.zeros_like(theta)
    for step in range(1, 5):
        # the inner steps: each rank moves its replica its own way
        local = (
            theta
            + torch.randn(
                theta.numel(), generator=torch.Generator().manual_seed(10 * step + rank)
            ).double()
        )
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(local.float(), model.parameters())
        if step % 2 == 0:  # the hand-written outer step: SGD with Nesterov momentum
            gathered = [torch.zeros_like(local) for _ in range(n)]
            dist.all_gather(gathered, local)
            delta = theta - torch.stack(gathered).mean(0)
            buf = delta if step == 2 else m * buf + delta
            theta = theta - lr * (delta + m * buf)
        strategy.after_step(step)
    got = torch.nn.utils.parameters_to_vector(model.parameters()).double()
    return float((got - theta).abs().max())


@pytest.mark.timeout(400)
def test_outer_nesterov_matches_hand_written_reference() -> None:
    for err in run_world(_two_outer_steps, 2, args=(0.7, 0.9), timeout=300):
        assert err < 1e-5, err  # fp32 strategy vs fp64 reference


@pytest.mark.timeout(600)  # two short runs
def test_streaming_fragments_cut_peak_bytes_and_end_with_equal_replicas(tmp_path: Any) -> None:
    base = {"strategy": "diloco", "period": 4, "max_steps": 12}
    whole, _ = run(str(tmp_path), "whole", **base)
    streamed, out = run(str(tmp_path), "streamed", fragments=4, **base)
    # every fragment synced three times (its offsets 0,1,2,3 within each period of 4)
    assert sum(streamed["outer_steps"]) >= 12 and len(streamed["fragment_sizes"]) == 4
    # the tiny model's fragments are its 4 tensors, the biggest 85 % of it: a strict cut only
    assert streamed["peak_bytes_per_step"] < whole["peak_bytes_per_step"]
    # every byte is counted, the thread's too: 3 rounds of every fragment + the final sync
    # of all four, against 3 whole syncs (2 ranks: native's cost is exactly the bytes). Each
    # sync counts its own tally: a fragment in flight across the end or an evaluation (a
    # paused meter) was once lost under load (3*30368 != 4*28920)
    assert 3 * streamed["outer_bytes_per_rank"] == 4 * whole["outer_bytes_per_rank"]
    assert torch.isfinite(params(out)).all()


def _int4_outer_step() -> dict[str, float]:
    import torch.distributed as dist

    from disttrain import collectives, strategies
    from disttrain.comm import world
    from disttrain.comm.meter import meter
    from disttrain.compression import blockquant
    from disttrain.train.trainer import loss_fn

    rank, n = dist.get_rank(), dist.get_world_size()
    cfg = config.load(
        {
            "strategy": "diloco",
            "workers": n,
            "period": 1,
            "outer_lr": 0.7,
            "outer_momentum": 0.0,
            "outer_dtype": "int4",
        }
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(100, 3)  # 303 entries: 5 blocks, the last one partial
    strategy = strategies.get("diloco").build(cfg, world.current(), loss_fn)
    strategy.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    theta = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    local = theta + torch.randn(theta.numel(), generator=torch.Generator().manual_seed(rank))
    with torch.no_grad():  # a copy: the parameters would otherwise be views of `local`
        torch.nn.utils.vector_to_parameters(local.clone(), model.parameters())
    collectives.set_length_check(False)  # its extra small collective is not the payload
    before = meter.bytes_sent
    strategy.after_step(1)
    sent = meter.bytes_sent - before
    # the reference: every rank's outer gradient as its 4-bit code decodes, averaged
    gathered = [torch.zeros_like(local) for _ in range(n)]
    dist.all_gather(gathered, local)
    decoded = [blockquant.decode(blockquant.encode(theta - g), theta.numel()) for g in gathered]
    want = theta - 0.7 * torch.stack(decoded).sum(0) / n
    got = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    everyone = [torch.zeros_like(got) for _ in range(n)]
    dist.all_gather(everyone, got)
    return {
        "err": float((got - want).abs().max()),
        "replicas": float(max((e - got).abs().max() for e in everyone)),
        "sent": sent,
        "stated": (n - 1) * blockquant.payload_bytes(theta.numel()),
        "booked": strategy.summary()["outer_bytes_per_rank"],
    }


@pytest.mark.timeout(400)
def test_int4_outer_gradients_are_the_mean_of_the_decoded_codes_on_every_rank() -> None:
    for out in run_world(_int4_outer_step, 2, timeout=300):
        assert out["err"] < 1e-6, out  # the same decodes, summed in rank order, fp32
        assert out["replicas"] == 0.0, out  # bit-identical on every rank
        # native all-gather: (n - 1) payloads per rank, 36 bytes per 64 entries
        assert out["sent"] == out["stated"] == out["booked"], out


def test_cost_model_says_int4_is_not_modelled() -> None:
    from disttrain.lab import costmodel
    from disttrain.lab.calibration import Calibration

    net, work = costmodel.Network(alpha=5e-6, beta=8 / 10e9), costmodel.Workload(10_000, 32)
    with pytest.raises(costmodel.NotModelled, match="gathered, not summed"):
        costmodel.predict("diloco:50:outer_dtype=int4", work, 4, net, Calibration.defaults())
    half = costmodel.predict(
        "diloco:50:outer_dtype=bf16:algorithm=ring", work, 4, net, Calibration.defaults()
    )
    assert half.bytes_per_rank == 2 * 10_000 * 2 * 3 / 4 / 50  # ring: 2(n-1)/n of 2 bytes each
