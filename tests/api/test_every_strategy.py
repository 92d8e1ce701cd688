"""Every registered strategy, in each of its modes, trains a user's regression through
``dt.distribute``: torch's DataLoader over a TensorDataset, the user's own MSE loss,
their own Adam. The final held-out loss is within 2 % of allreduce's for the strategies
that compute the same mathematics (zero, pipeline, tensor, hybrid, synchronous ps); those
that talk less must learn it (held-out MSE under 15 % of the targets' variance: R^2 > 0.85)
and, where they meet it, be within issue 49's 25 % of allreduce's (``BAND``); the others
hold that band as an xfail with their figures (strict, failing the day they meet it, except
the parameter server's modes, whose runs depend on arrival order).

Measured 2026-12-02 (held-out MSE / allreduce's at 80 steps; the model's seed 0, this
test's, then 1 and 2 by a local change of ``_model``'s seed; allreduce 0.0518, 0.0513,
0.0548): localsgd 0.93 1.36 0.76 (seeds 3-5: 0.79 0.85 0.94; before Adam's local steps ran
at lr·√N, 2.04 2.00 1.17), diloco 0.77 0.71 0.76 (its outer step 1.0 / Nesterov 0.3; at the
paper's 0.7 / 0.9 5.58 1.80 6.43 before the √N, 3.61 16.8 9.07 after), decentralized 1.00
1.00 1.00; not yet: ps async 1.92 2.11 1.41, ssp 4.99 2.43 3.19, softsync 2.78 2.46 3.51
(asynchronous: each run's order of arrival differs), top-k 23.3 21.8 22.1; one-bit
diverges. Before: five times the steps (EPOCHS = 40: 400 steps, one run of this module's
``_train``, 2026-12-02) closed part of the gap, not all: allreduce 0.0255, localsgd 0.0273
(+7 %), ps async 0.0182 (better), softsync 0.0384 (+51 %), diloco 0.0462 (+81 %), ssp
0.160 (6x). Rank 0 returns the whole model.

One world of 4 ranks holds every case (SharedWorlds): the parameter server takes 3
workers and 1 server (with one worker every mode is synchronous), hybrid a 2 x 2 mesh,
the rest 4 workers. Running the cases one after another in one process group found a
bug: a second parameter server read the first one's endpoints from the store (each
set-up now has its own keys, strategies/ps.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.harness import SharedWorlds
from tests.modes import modes

# one xdist worker runs the module: its shared worlds (and fixtures) once, not once a worker
pytestmark = pytest.mark.xdist_group("api-every-strategy")

WORLD, BATCH, EPOCHS, LR = 4, 48, 8, 0.01
#: same mathematics as allreduce: within 2 %; the rest talk less: within 25 %
SAME = {"allreduce", "zero", "pipeline", "tensor", "hybrid:tp", "ps:sync"}
#: talking less, within issue 49's 25 % of allreduce's held-out loss (seeds: the docstring)
BAND = {"localsgd", "diloco", "decentralized"}
#: talking less, not within it yet: held-out MSE / allreduce's at model seeds 0, 1, 2
NOT_YET = {
    "allreduce:topk": "top-k 0.01 with error feedback under Adam: 23.3 21.8 22.1",
    "ps:async": "each push applied at lr/N (SGD's share): 1.92 2.11 1.41",
    "ps:ssp": "each push applied at lr/N (SGD's share): 4.99 2.43 3.19",
    "ps:softsync": "no cause found: 2.78 2.46 3.51",
}


def _data() -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A linear regression with noise: 480 training samples, 128 held out."""
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(7)
    x = torch.randn(608, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    y = x @ w + 0.1 * torch.randn(608, 1, generator=g)
    return TensorDataset(x[:480], y[:480]), x[480:], y[480:]


def _model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, o in [(8, 32), (32, 32), (32, 32)]:
        layers += [nn.Linear(i, o), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(32, 1))


def _train(keywords: dict[str, Any]) -> float | None:
    import disttrain as dt

    train, x_test, y_test = _data()
    model = _model()
    settings = dict(keywords)
    strategy = settings.pop("strategy")
    run = dt.distribute(
        model, torch.optim.Adam(model.parameters(), lr=LR), strategy, batch_size=BATCH, **settings
    )
    if run.serves:
        run.serve()
        return None
    for epoch in range(EPOCHS):
        for batch in run.loader(train, epoch=epoch):
            run.step(batch, F.mse_loss)
    whole = run.finish()
    if whole is None:
        return None
    with torch.no_grad():
        return float(F.mse_loss(whole(x_test), y_test))


CASES = modes()
WORLDS = SharedWorlds({label: (WORLD, _train, (kw,)) for label, kw in CASES}, timeout=300)


#: one-bit compression with error feedback under Adam diverges on this regression (test MSE
#: 11.7 against a variance of 10.5); why is not investigated. The trainer's own default
#: for one-bit is SGD at 0.5 (docs/compression.md), where it trains
DIVERGES = {"decentralized:onebit"}


@pytest.mark.timeout(400)  # the first case run pays for the world's every mode
@pytest.mark.parametrize(
    "label",
    [
        pytest.param(label, marks=pytest.mark.xfail(strict=True, reason="one-bit + Adam"))
        if label in DIVERGES
        else label
        for label, _ in CASES
    ],
)
def test_strategy_trains_a_user_regression(label: str) -> None:
    anchor = WORLDS.get("allreduce")[0]
    got = WORLDS.get(label)[0]
    assert anchor is not None and got is not None
    variance = float(_data()[2].var())
    assert anchor < 0.01 * variance, f"allreduce did not learn: test MSE {anchor:.3f}"
    if label in SAME:
        assert abs(got - anchor) <= 0.02 * anchor, f"{label}: {got:.5f} vs {anchor:.5f}"
    else:
        assert got < 0.15 * variance, f"{label}: test MSE {got:.4f}, allreduce {anchor:.4f}"


@pytest.mark.parametrize(
    "label",
    [
        *sorted(BAND),
        *(
            # strict where a run is deterministic; the parameter server's asynchronous modes
            # apply pushes in arrival order, so a run may land in the band by chance (ps async
            # at 1.41x passed it once in a CI rehearsal, 2026-12-02): not enforced there
            pytest.param(
                label,
                marks=pytest.mark.xfail(strict=not label.startswith("ps:"), reason=why),
            )
            for label, why in sorted(NOT_YET.items())
        ),
    ],
)
def test_talking_less_is_within_25_percent_of_allreduce(label: str) -> None:
    anchor = WORLDS.get("allreduce")[0]
    got = WORLDS.get(label)[0]
    assert anchor is not None and got is not None
    assert got <= 1.25 * anchor, f"{label}: test MSE {got:.4f}, allreduce {anchor:.4f}"


def test_every_mode_that_talks_less_is_held_to_the_band_or_waits_for_it() -> None:
    talking_less = {label for label, _ in CASES} - SAME - DIVERGES
    assert talking_less == BAND | set(NOT_YET)
