"""Memory per worker in the cost model (``StrategyCost.predict_memory``) against what real runs
count (``memory_per_rank`` in summary.json), its terms against torch, and advise's fit filter.

Tolerance 5 % (issue #17): the counted bytes differ from the formulas only by the padding
of uneven shards (ZeRO: each flat group is cut into N equal chunks).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from disttrain import amp
from disttrain.cli import main
from disttrain.costing import CAST_BYTES, STATE_COPIES, Memory, Prediction, Workload
from disttrain.lab import costmodel
from disttrain.lab.advise import parse_bytes, recommendation
from disttrain.lab.costmodel import Row, fitting
from tests.harness import run_world

#: (spec, train flags): the allreduce strategy, ZeRO stages 1-3, a pipeline, tensor slices
RUNS = [
    ("allreduce", {}),
    *((f"zero:{s}", {"strategy": "zero", "zero_stage": s}) for s in (1, 2, 3)),
    ("pipeline", {"strategy": "pipeline"}),
    ("tensor", {"strategy": "tensor"}),
]


def _jobs(out: str) -> list[dict[str, Any]]:
    from disttrain import config
    from disttrain.train.trainer import train

    summaries = []
    for i, (_, flags) in enumerate(RUNS):
        folder = os.path.join(out, str(i))
        os.makedirs(folder, exist_ok=True)
        cfg = config.load(
            {
                "out": folder,
                "progress": False,
                "epochs": 1,
                "max_steps": 2,
                "batch_size": 32,
                "optimizer": "adam",
                "model": "mlp",
                **flags,
            }
        )
        summaries.append(train(cfg))
    return summaries


@pytest.mark.timeout(300)
def test_predicted_memory_matches_real_runs(tmp_path: Path) -> None:
    """2 workers, 2 steps of Adam on the 6.4M-parameter mlp: each counted term of the
    fullest rank within 5 % of the strategy's formula (stage 3's gathered layers included)."""
    from disttrain.data import load_dataset
    from disttrain.models import build_model

    n = 2
    summaries = run_world(_jobs, n, args=(str(tmp_path),), timeout=250)[0]
    with torch.device("meta"):
        model = build_model("mlp", load_dataset("digits"))
    for (spec, _), summary in zip(RUNS, summaries, strict=True):
        work = Workload(params=summary["parameters"], batch_size=32, optimizer="adam")
        want = costmodel.predict_memory(spec, work, n, model)
        counted = summary["memory_per_rank"]
        terms = {
            "parameters": want.parameters,
            "gradients": want.gradients,
            "optimizer_state": want.optimizer_state,
            "gathered_peak": want.gathered,
        }
        for key, predicted in terms.items():
            got = max(counted[key])  # the fullest worker (a pipeline's stages differ)
            assert abs(got - predicted) <= 0.05 * predicted, (spec, key, counted[key], predicted)
    # the ZeRO paper's totals, Ψ the parameters: 16Ψ, 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N
    psi = summaries[0]["parameters"]
    held = [
        costmodel.predict_memory(s, Workload(psi, 32, optimizer="adam"), n, model).held
        for s, _ in RUNS[:4]
    ]
    assert held == pytest.approx(
        [16 * psi, 8 * psi + 8 * psi / n, 4 * psi + 12 * psi / n, 16 * psi / n]
    )


@pytest.mark.parametrize("name", sorted(STATE_COPIES))
def test_optimizer_state_is_what_torch_keeps(name: str) -> None:
    from disttrain.config import TrainConfig
    from disttrain.train.optimizers import make_optimizer

    layer = nn.Linear(30, 20)
    opt = make_optimizer(layer.parameters(), TrainConfig(optimizer=name))
    layer(torch.randn(4, 30)).sum().backward()
    opt.step()
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    counted = sum(t.numel() * t.element_size() for t in state if t.numel() > 1)  # not Adam's step
    assert counted == 4 * STATE_COPIES[name] * (30 * 20 + 20)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_autocast_keeps_a_cast_copy_of_each_weight_for_backward(precision: str) -> None:
    """What autograd saves for backward in bf16/fp16 that has a weight's shape (or its
    transpose, as linear saves it): 2 bytes a weight of every layer whose input needs a
    gradient, so all but the first. CAST_BYTES counts the first too: autocast's cache
    holds every cast weight until the forward ends."""
    model = nn.Sequential(
        nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)
    )
    shapes = {tuple(m.weight.shape) for m in model if isinstance(m, nn.Linear)}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == amp.DTYPES[precision] and {tuple(t.shape), tuple(t.shape)[::-1]} & shapes:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, amp.autocast(precision, torch.device("cpu")):
        model(torch.randn(16, 64)).float().sum()
    weights = sum(m.weight.numel() for m in model if isinstance(m, nn.Linear))
    assert sum(saved.values()) == CAST_BYTES[precision] * (weights - model[0].weight.numel())


def _row(label: str, step_ms: float | None, total_mb: float | None, limit_mb: float) -> Row:
    step = None
    if step_ms is not None:
        step = Prediction(
            label,
            8,
            step_ms / 1e3,
            step_ms / 2e3,
            step_ms / 2e3,
            0,
            0,
            0.5,
            "compute",
            f"{label} reason",
            100.0,
        )
    memory = None if total_mb is None else Memory(total_mb * 1e6, 0, 0)
    fits = None if memory is None else memory.total <= limit_mb * 1e6
    return Row(label, step, memory, "", fits)


def test_the_fit_filter_and_the_recommendation() -> None:
    work, net = Workload(params=10**9, batch_size=256), costmodel.Network(0.0, 8 / 1e10)
    rows = [
        _row("allreduce:ring", 10, 16_000, 2000),
        _row("zero:2", 12, 1_900, 2000),
        _row("zero:3", 15, 1_200, 2000),
        _row("pipeline", None, 1_000, 2000),
    ]
    assert [r.label for r in fitting(rows)] == ["zero:2", "zero:3"]  # modelled and fitting
    line = recommendation(rows, work, net, limit=2_000_000_000)
    assert ": zero:2 (12.0 ms a step" in line and "in 2 GB per worker" in line
    assert "as fast as the next (zero:3)" in line
    # without a limit: the fastest of all
    free = [Row(r.label, r.step, r.memory) for r in rows]
    assert ": allreduce:ring (10.0 ms" in recommendation(free, work, net)
    # none fits: one line naming the least
    tight = [
        _row(
            r.label,
            r.step.step_seconds * 1e3 if r.step else None,
            r.memory.total / 1e6 if r.memory else None,
            500,
        )
        for r in rows
    ]
    line = recommendation(tight, work, net, limit=500_000_000)
    assert line == (
        "recommendation: none of the 4 strategies fits in 500 MB per worker; "
        "the least memory is pipeline's 1 GB"
    )
    # only a memory-only row fits
    only = [*tight[:3], _row("pipeline", None, 400, 500)]
    assert "only pipeline fits in 500 MB per worker" in recommendation(only, work, net, 500 * 10**6)


def test_sizes() -> None:
    assert parse_bytes("2GB", "--memory-per-worker") == 2 * 10**9
    assert parse_bytes("1.5GiB", "--memory-per-worker") == int(1.5 * 2**30)
    assert parse_bytes("512 mb", "--memory-per-worker") == 512 * 10**6
    for bad in ("2", "2G", "lots", "0B", "-1GB"):
        with pytest.raises(Exception, match="--memory-per-worker"):
            parse_bytes(bad, "--memory-per-worker")


def test_advise_marks_what_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("disttrain.lab.advise.DEFAULT_PATH", str(tmp_path / "none.json"))
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "rows.json"
    # 100M parameters, Adam: replicated 1.6 GB; stage 3 on 8 workers 200 MB + 2 of 10 layers
    assert (
        main(
            [
                "advise",
                "--params",
                "100M",
                "--nodes",
                "8",
                "--optimizer",
                "adam",
                "--memory-per-worker",
                "800MB",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "memory/worker" in text and "fits" in text
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["allreduce:ring"]["memory"]["total"] == pytest.approx(16 * 100e6)
    assert rows["allreduce:ring"]["fits"] is False
    assert rows["zero:3"]["memory"]["total"] == pytest.approx(16 * 100e6 / 8 + 4 * 20e6)
    assert rows["zero:3"]["fits"] is True and rows["zero:1"]["fits"] is False
    assert rows["tensor"]["step_seconds"] is None and rows["tensor"]["fits"] is True
    assert rows["pipeline:1f1b"]["fits"] is True  # 1/8 of the layers a stage
    # the recommendation: the fastest of the rows that fit (the filter: the test above)
    fitting = [r for r in rows.values() if r["fits"] and r["step_seconds"] is not None]
    fastest = min(fitting, key=lambda r: r["step_seconds"])["strategy"]
    best = text.strip().splitlines()[-1]
    assert best.split(": ")[2].split(" (")[0] == fastest, best
    # nothing fits: said in one line
    assert main(["advise", "--params", "100M", "--nodes", "8", "--memory-per-worker", "1MB"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("recommendation: none of the ") and "fits in 1 MB per worker" in last
