"""``--compile``: a compiled run trains as the eager one, and really compiled.

Every registered strategy runs 4 steps eager and with
``--compile aot_eager`` (dynamo and AOTAutograd trace the forward and backward; no code is
generated, so the aten ops and their order are the eager run's): the parameters agree
within 1e-5 and rank 0 captured at least one graph (summary.json ``compiled_graphs``). One
run with ``inductor`` (torch's compiler, C++ code on the CPU: ~15 s of compiling) agrees
within 1e-4 (fused kernels sum in another order).

``make test`` runs two rows, the whole model (allreduce) and a part of it (a pipeline
stage); the others, a tensor-parallel slice among them, are marked slow (``make
test-long``): each costs two runs (~11 s). So is the inductor run (36 CPU-s, most of it
torch's C++ compiler: the aot_eager rows cover our part of the path, dynamo and
AOTAutograd tracing the step, in ``make test``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from disttrain.registry import load_plugins
from disttrain.strategies import STRATEGIES
from tests.test_cli import run_cli

load_plugins()
#: each strategy with the flags of its first mode (ps: sync, deterministic; hybrid: --tp 2)
ROWS = {
    name: list(next(iter(kind.settings.modes.values()), ())) for name, kind in STRATEGIES.items()
}
FAST = {"allreduce", "pipeline"}


def _run(out: Path, strategy: str, flags: list[str], *extra: str) -> tuple[dict, dict]:
    done = run_cli(
        "train",
        "--strategy",
        strategy,
        *flags,
        "--max-steps",
        "4",
        "--epochs",
        "1",
        "--seed",
        "3",
        "--no-progress",
        "--out",
        str(out),
        *extra,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    return torch.load(out / "model.pt", weights_only=True), summary


def _worst(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()  # the same state_dict keys: no wrapper's prefix
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "strategy", [s if s in FAST else pytest.param(s, marks=pytest.mark.slow) for s in sorted(ROWS)]
)
def test_a_compiled_run_trains_as_the_eager_one(strategy: str, tmp_path: Path) -> None:
    eager, plain = _run(tmp_path / "eager", strategy, ROWS[strategy])
    compiled, summary = _run(tmp_path / "aot", strategy, ROWS[strategy], "--compile", "aot_eager")
    assert plain["compiled_graphs"] == 0 and summary["compiled_graphs"] >= 1, summary
    assert _worst(eager, compiled) <= 1e-5


@pytest.mark.slow  # make test-long: 36 CPU-s of C++ compiling; aot_eager's rows above are fast
@pytest.mark.timeout(300)
def test_inductor_compiles_and_stays_within_1e_4(tmp_path: Path) -> None:
    eager, _ = _run(tmp_path / "eager", "allreduce", [])
    compiled, summary = _run(tmp_path / "inductor", "allreduce", [], "--compile", "inductor")
    assert summary["compiled_graphs"] >= 1, summary
    assert _worst(eager, compiled) <= 1e-4
