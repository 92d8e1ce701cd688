"""Decentralized options: fewer active workers early, and DGC momentum correction."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from tests.harness import SharedWorlds
from tests.strategies.test_decentralized import _steps
from tests.strategies.test_localsgd import tiny_mlp

ONEBIT = "onebit:0.01"


WARM = {"compression": ONEBIT, "active_warmup_steps": 2, "active_workers": 1}
DGC = {"compression": ONEBIT, "momentum_correction": True, "optimizer": "momentum"}
#: the runs of this file in one world per size (2 spawns instead of 6: a spawn's start-up
#: costs more than a run; each builds its own model and seeds and resets the meter)
RUNS = SharedWorlds(
    {
        "warm 2": (3, _steps, (WARM, 2)),
        "warm 3": (3, _steps, (WARM, 3)),
        "dgc 3 ranks": (3, _steps, (DGC, 5)),
        "alone": (1, _steps, ({"compression": ONEBIT}, 2)),
        "dgc": (1, _steps, (DGC, 6)),
        "plain": (1, _steps, ({"compression": ONEBIT}, 6)),
    },
    timeout=400,
)


@pytest.mark.timeout(600)  # two worlds of spawned ranks on a shared machine
def test_during_the_active_warmup_only_rank_0_moves_the_replicas() -> None:
    three, alone = RUNS.get("warm 2"), RUNS.get("alone")
    for flat, _, summary, _ in three:
        # every replica equals rank 0 training alone on its own batches: nothing from 1 and 2
        # (to float rounding: the start is a 3-rank average of equal tensors, (x+x+x)/3)
        torch.testing.assert_close(torch.tensor(flat), torch.tensor(alone[0][0]), atol=1e-6, rtol=0)
        assert summary["active_warmup_steps"] == 2 and summary["active_workers"] == 1
    # ranks 1 and 2 sent only empty payloads (an index header each), rank 0 its entries
    assert three[1][1] < three[0][1] / 4
    after = RUNS.get("warm 3")
    assert after[0][0] == after[1][0] == after[2][0]
    # from step 3 on ranks 1 and 2 send their entries too
    assert after[1][1] > 4 * three[1][1]


def _dgc_reference(steps: int, tau: float, lr: float, m: float) -> list[float]:
    """Lin et al. 2018 with one worker, by hand: u = m·u + g; v += u; send ±τ where |v| > τ;
    v -= sent; u = 0 where sent (momentum factor masking); w -= lr·sent."""
    torch.manual_seed(0)
    model = tiny_mlp()
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(0)  # rank 0's batches in _steps
    u = v = None
    for _ in range(steps):
        x, y = torch.randn(16, 64, generator=gen), torch.randint(0, 10, (16,), generator=gen)
        x = x + y[:, None].float()
        for p in params:
            p.grad = None
        torch.nn.functional.cross_entropy(model(x), y).backward()
        g = _flatten_dense_tensors([p.grad for p in params])
        u = g.clone() if u is None else u.mul_(m).add_(g)
        v = u.clone() if v is None else v.add_(u)
        sent = torch.where(v.abs() > tau, torch.sign(v) * tau, torch.zeros_like(v))
        v.sub_(sent)
        u.masked_fill_(sent != 0, 0.0)
        with torch.no_grad():
            for p, d in zip(params, _unflatten_dense_tensors(sent, params), strict=True):
                p.sub_(lr * d)
    return torch.cat([p.detach().reshape(-1) for p in params]).tolist()


@pytest.mark.timeout(600)
def test_momentum_correction_follows_the_dgc_formula() -> None:
    got = RUNS.get("dgc")[0]
    ref = _dgc_reference(6, 0.01, 0.1, 0.9)
    torch.testing.assert_close(torch.tensor(got[0]), torch.tensor(ref), atol=1e-6, rtol=0)
    plain = RUNS.get("plain")[0]
    assert plain[0] != got[0]  # not vacuous: without the correction the run differs
    assert got[2]["momentum_correction"] == 0.9


@pytest.mark.timeout(600)
def test_momentum_correction_keeps_replicas_identical() -> None:
    results = RUNS.get("dgc 3 ranks")
    assert results[0][0] == results[1][0] == results[2][0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--momentum-correction", "--optimizer", "adam"], "use --optimizer momentum"),
        # one-bit at momentum's own lr: 0.63 after 3 epochs; the correction or sgd train
        (["--optimizer", "momentum"], "use `--optimizer sgd` (onebit's default, lr 0.5), add"),
        (
            [
                "--active-warmup-steps",
                "5",
                "--topology",
                "ring",
                "--workers",
                "3",
                "--batch-size",
                "48",
            ],
            "--topology all",
        ),
        (["--active-warmup-steps", "5", "--active-workers", "9"], "exceeds the 2 workers"),
        (["--active-workers", "0"], "--active-workers must be >= 1"),
    ],
)
def test_bad_option_combinations_are_one_line_and_exit_2(
    args: list[str], says: str, capsys: Any
) -> None:
    from disttrain.cli import main

    base = ["train", "--strategy", "decentralized", "--compression", ONEBIT, "--workers", "2"]
    assert main([*base, *args]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_momentum_correction_brings_momentum_at_its_own_lr_to_one_bit() -> None:
    from disttrain import config

    cfg = config.load(
        {"strategy": "decentralized", "compression": ONEBIT, "momentum_correction": True}
    )
    assert (cfg.train.optimizer, cfg.train.lr) == ("momentum", 0.05)
