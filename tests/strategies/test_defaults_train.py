"""Every strategy's defaults train (issue 23): run with only its name (and what it
requires), each registered strategy and mode trains the default workload (mlp on digits)
to within 3 points of test accuracy of the allreduce default after the same epochs, or
pre-flight refuses the combination in one line naming flags that do (`use `FLAGS``),
and those flags are held to the same band.

Through the real command, one run per row, against the allreduce anchor measured in the
same session. 5 epochs: where the issue measured the failures (ssp 0.878, async 0.933,
decentralized one-bit 0.783 vs 0.967); at 3 epochs the per-epoch noise of good modes
(softsync 0.911 at epoch 3, 0.944 at epoch 4) is as large as the band. Cost: one run of
the default workload per row plus the anchor, 14 runs (about 3 minutes of the suite's
28 serial minutes, 2026-11-27); marked slow: `make test-long` runs it. `make test` runs
its fast sibling (the end of this file): 3 epochs (1 for rows that take allreduce's own
steps), a 20-point band.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from disttrain.config import OPTIMIZER_LR
from disttrain.ps.consistency import MODES
from disttrain.registry import load_plugins
from disttrain.strategies import STRATEGIES
from tests import zygote

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 5
BAND = 0.03  # test accuracy, absolute: the "within 3 points"

load_plugins()  # $DISTTRAIN_PLUGINS: an out-of-tree strategy joins the rows by itself
#: registered strategy -> its rows: (label, the flags it requires or that pick a mode), from
#: each strategy's own declaration (``StrategySettings.modes``); the allreduce default is
#: the anchor, not a row.
ROWS: dict[str, list[tuple[str, list[str]]]] = {
    name: [
        (f"{name} {mode}".strip(), list(flags))
        for mode, flags in kind.settings.modes.items()
        if (name, mode) != ("allreduce", "")
    ]
    for name, kind in STRATEGIES.items()
}
#: Rows known not to train yet, with what was measured (issue 23 stays open for them).
#: Not run (run=False): each would cost a run to confirm a known failure.
KNOWN_BAD: dict[str, str] = {}
#: Rows whose runs differ from one to the next (gradients applied in arrival order): on
#: 2 loaded cores the same command gave 0.931 and 0.886 (before push_lr_share). One more
#: run when the first is below the band; a default that does not train fails both.
NONDETERMINISTIC = {"ps async", "ps ssp", "ps softsync"}
#: Rows that passed and failed the same command in CI rehearsals: run, not enforced.
#: async and ssp are enforced (each push at lr/N, ps/config.py push_lr_share: async 5 of
#: 5 and ssp 4 of 5 single runs in the band, 2026-11-25).
UNSTABLE: dict[str, str] = {
    "ps softsync": (
        "16 of 16 quiet runs in the band with --staleness-lr (its default), but 2 of 3 "
        "beside one busy process and 0.925, 0.917 in a CI rehearsal (2026-11-26; "
        "benchmarks/results/softsync_defaults.txt): no default found yet that holds under "
        "contention"
    ),
}
CASES = [
    pytest.param(
        name,
        label,
        flags,
        id=label,
        marks=[pytest.mark.xfail(run=False, reason=KNOWN_BAD[label])]
        if label in KNOWN_BAD
        else [pytest.mark.xfail(strict=False, reason=UNSTABLE[label])]
        if label in UNSTABLE
        else [],
    )
    for name, rows in ROWS.items()
    for label, flags in rows
]


def _train(out: Path, *flags: str, epochs: int = EPOCHS) -> subprocess.CompletedProcess[str]:
    # src first; a caller's own path (an out-of-tree plug-in's folder) kept after it
    path = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [
        sys.executable,
        "-m",
        "disttrain",
        "train",
        "--epochs",
        str(epochs),
        "--no-progress",
        "--out",
        str(out),
        *flags,
    ]
    return zygote.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=540)


def _accuracy(out: Path) -> float:
    return float(json.loads((out / "summary.json").read_text())["final_accuracy"])


@pytest.fixture(scope="module")
def anchor(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The allreduce default's accuracy after EPOCHS (same machine, same session)."""
    out = tmp_path_factory.mktemp("anchor") / "run"
    done = _train(out)
    assert done.returncode == 0, done.stderr
    return _accuracy(out)


def test_every_registered_strategy_and_ps_mode_has_a_row() -> None:
    assert set(ROWS) == set(STRATEGIES.names())
    assert all(ROWS[name] for name in ROWS if name != "allreduce")
    assert {label.split()[1] for label, _ in ROWS["ps"]} == set(MODES)
    assert "decentralized onebit" in {label for label, _ in ROWS["decentralized"]}


@pytest.mark.slow  # make test-long; its fast sibling below is in make test
@pytest.mark.xdist_group("defaults-train")
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("strategy", "label", "flags"), CASES)
def test_defaults_train_within_3_points_of_allreduce(
    strategy: str, label: str, flags: list[str], anchor: float, tmp_path: Path
) -> None:
    _within_band(tmp_path, strategy, label, flags, anchor, BAND, EPOCHS)


def _within_band(
    tmp_path: Path,
    strategy: str,
    label: str,
    flags: list[str],
    anchor: float,
    band: float,
    epochs: int,
) -> None:
    """The row's accuracy within ``band`` of the anchor (a second run for a nondeterministic
    row whose first is below it), or the test fails naming every accuracy seen."""
    got: list[float] = []
    for attempt in range(2 if label in NONDETERMINISTIC else 1):
        accuracy, where = _train_row(tmp_path / f"try{attempt}", strategy, label, flags, epochs)
        got.append(accuracy)
        if accuracy >= anchor - band:
            return
    seen = ", ".join(f"{a:.4f}" for a in got)
    pytest.fail(f"{where}: {seen} vs allreduce {anchor:.4f} after {epochs} epochs (band {band})")


def _train_row(
    folder: Path, strategy: str, label: str, flags: list[str], epochs: int = EPOCHS
) -> tuple[float, str]:
    """The row's accuracy, through the refusal's named flags if pre-flight refuses it."""
    done = _train(folder / "run", "--strategy", strategy, *flags, epochs=epochs)
    if done.returncode == 2:  # refused: one line naming flags that train
        lines = done.stderr.strip().splitlines()
        named = re.search(r"use `([^`]+)`", lines[-1])
        assert len(lines) == 1 and named, done.stderr
        extra = named.group(1).split()
        done = _train(folder / "named", "--strategy", strategy, *flags, *extra, epochs=epochs)
        assert done.returncode == 0, done.stderr
        return _accuracy(folder / "named"), f"{label} with {' '.join(extra)}"
    assert done.returncode == 0, done.stderr
    return _accuracy(folder / "run"), label


#: Each row with each other ``--optimizer`` than the run's default, momentum (a row whose
#: component has its own, as one-bit's and top-k's sgd, is also run with adam and sgd's
#: own lr here; one-bit with an explicit momentum is refused, tests/test_bad_inputs.py):
#: every strategy and compressor trains with every optimizer's own default lr
#: (config.OPTIMIZER_LR), held to the same band against allreduce with that optimizer.
#: ``make test-long``; results: benchmarks/RESULTS.md, "Defaults that train".
OTHER_OPTIMIZERS = [name for name in OPTIMIZER_LR if name != "momentum"]
#: A row refused with an optimizer (one-bit with adam: config says why) is run through
#: the flags its refusal names (``_train_row``), as the rows above.
OPTIMIZER_CASES = [
    pytest.param(name, label, flags, optimizer, id=f"{label} {optimizer}")
    for optimizer in OTHER_OPTIMIZERS
    for name, rows in ROWS.items()
    for label, flags in rows
]
_optimizer_anchors: dict[str, float] = {}


@pytest.fixture(scope="module")
def optimizer_anchor(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], float]:
    """allreduce's accuracy after EPOCHS with ``optimizer`` (one run each, then cached)."""

    def get(optimizer: str) -> float:
        if optimizer not in _optimizer_anchors:
            out = tmp_path_factory.mktemp(f"anchor-{optimizer}") / "run"
            done = _train(out, "--optimizer", optimizer)
            assert done.returncode == 0, done.stderr
            _optimizer_anchors[optimizer] = _accuracy(out)
        return _optimizer_anchors[optimizer]

    return get


@pytest.mark.slow  # make test-long: 2 optimizers x 15 rows, about 10 minutes
@pytest.mark.xdist_group("defaults-train")
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("strategy", "label", "flags", "optimizer"), OPTIMIZER_CASES)
def test_defaults_train_with_each_optimizer(
    strategy: str,
    label: str,
    flags: list[str],
    optimizer: str,
    optimizer_anchor: Callable[[str], float],
    tmp_path: Path,
) -> None:
    _within_band(
        tmp_path,
        strategy,
        label,
        [*flags, "--optimizer", optimizer],
        optimizer_anchor(optimizer),
        BAND,
        EPOCHS,
    )


#: The fast sibling in ``make test`` (the 5-epoch, 3-point band above is ``make
#: test-long``): every row after FAST_EPOCHS (EXACT rows: one) within FAST_BAND of the
#: allreduce default after as many. It catches a default that does not train (the
#: README's ZeRO + adam example at 0.19; chance is 0.10), not a shortfall of a few points:
#: early epochs are noisy where gradients arrive in any order (ps ssp gave 0.79 against
#: 0.96 after 3 epochs, in the band after 5). The nondeterministic rows get a second run, as above.
FAST_EPOCHS = 3
FAST_BAND = 0.20
#: Rows whose default takes allreduce's own steps: the same test accuracy as the anchor
#: after every epoch, to the sample (0.800, 0.853, 0.958, 2026-12-02). They run one epoch,
#: held to the same band against the anchor's first epoch (its metrics.jsonl: the lr is
#: constant, so a 3-epoch run's first epoch is a 1-epoch run). A default that does not
#: train fails there as after 3: one epoch with --lr 1e-6 ended at 0.103, the README's
#: adam at lr 0.05 at 0.100-0.103, on each of these rows (2026-12-02), against 0.60. The other
#: rows (compressed, local or arrival-order steps) are noisy early (softsync 0.47-0.77 after
#: one or two epochs) and run FAST_EPOCHS.
EXACT = {"decentralized", "pipeline", "tensor", "hybrid tp", "ps sync", "zero"}


@pytest.fixture(scope="module")
def fast_anchor(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The allreduce default's test accuracy after each of FAST_EPOCHS epochs."""
    out = tmp_path_factory.mktemp("fast-anchor") / "run"
    done = _train(out, epochs=FAST_EPOCHS)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    per_epoch = [float(r["test_accuracy"]) for r in lines if "test_accuracy" in r]
    assert len(per_epoch) == FAST_EPOCHS and per_epoch[-1] == _accuracy(out), per_epoch
    return per_epoch


FAST_CASES = [
    pytest.param(name, label, flags, id=label)
    for name, rows in ROWS.items()
    for label, flags in rows
]


@pytest.mark.xdist_group("defaults-train")  # one anchor: the rows run in one xdist worker
@pytest.mark.parametrize(("strategy", "label", "flags"), FAST_CASES)
def test_defaults_train_near_allreduce_in_a_few_epochs(
    strategy: str, label: str, flags: list[str], fast_anchor: list[float], tmp_path: Path
) -> None:
    epochs = 1 if label in EXACT else FAST_EPOCHS
    anchor = fast_anchor[epochs - 1]
    _within_band(tmp_path, strategy, label, flags, anchor, FAST_BAND, epochs)


#: The README's ZeRO line (``--strategy zero --zero-stage 3 --optimizer adam``) with each
#: optimizer, 2 epochs: each must train with its own default lr (config.OPTIMIZER_LR).
#: Adam at the SGD default 0.05 ended at 0.19 (chance is 0.10); at its own 1e-3 it reached
#: 0.95, sgd 0.84 and momentum 0.85 (2026-11-28). The floor for the README's adam is the
#: issue's 0.90; the others are held to 0.80, a default that trains.
OPTIMIZER_FLOOR = {"adam": 0.90}


@pytest.mark.parametrize("optimizer", list(OPTIMIZER_LR))
def test_the_readme_zero_example_trains_with_each_optimizer_s_default_lr(
    optimizer: str, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    done = _train(
        out, "--strategy", "zero", "--zero-stage", "3", "--optimizer", optimizer, epochs=2
    )
    assert done.returncode == 0, done.stderr
    assert _accuracy(out) >= OPTIMIZER_FLOOR.get(optimizer, 0.80)
