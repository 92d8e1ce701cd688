"""A strategy is a descriptor of four parts (issue 37): its runtime hooks, its settings, its
cost (the lab's, never a worker's) and its capabilities. Checked for every registered one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from disttrain import strategies
from disttrain.config import field_names
from disttrain.registry import load_plugins
from disttrain.strategies.base import Strategy, StrategyKind
from disttrain.strategies.capabilities import Reshards, ShardsData
from disttrain.strategies.cost.base import StrategyCost
from disttrain.strategies.settings import StrategySettings

SRC = Path(__file__).resolve().parents[2] / "src"
load_plugins()  # $DISTTRAIN_PLUGINS: an out-of-tree strategy is checked as every other
NAMES = list(strategies.STRATEGIES)
#: issue 37: the runtime base a strategy implements has at most 12 members
MOST_MEMBERS = 12


def _members(cls: type) -> set[str]:
    own = set(vars(cls)) | set(getattr(cls, "__annotations__", {}))
    return {m for m in own if not (m.startswith("__") and m.endswith("__"))}


def test_the_runtime_base_is_small() -> None:
    assert len(_members(Strategy)) <= MOST_MEMBERS, sorted(_members(Strategy))


@pytest.mark.parametrize("name", NAMES)
def test_each_kind_has_its_four_parts(name: str) -> None:
    kind = strategies.get(name)
    assert isinstance(kind, StrategyKind) and kind.name == name
    assert issubclass(kind.runtime, Strategy) and kind.runtime.name == name
    assert issubclass(kind.settings, StrategySettings)
    cost = kind.cost_model()
    assert isinstance(cost, StrategyCost) and cost.name == name
    # a module of its own: in the runtime's, every worker would import the cost model
    assert kind.cost.partition(":")[0] != kind.runtime.__module__, kind.cost
    # a cost part states only settings its strategy reads (or its assumptions)
    assert set(cost.cost_settings) <= field_names(kind.settings.reads_settings)


@pytest.mark.parametrize("name", NAMES)
def test_capabilities_are_classes_not_flags(name: str) -> None:
    """No strategy carries the old flags or their NotImplementedError defaults."""
    runtime = strategies.get(name).runtime
    for flag in ("shrinks", "grows", "reshards", "main_setting", "predict", "reads_settings"):
        assert not hasattr(runtime, flag), f"{name}.{flag}"
    # every hook of every capability it takes is implemented (an ABC's abstract one left
    # over would fail only when the trainer builds it, in a worker)
    assert not getattr(runtime, "__abstractmethods__", frozenset()), runtime.__abstractmethods__
    if strategies.get(name).shares_activations:  # model parallel: ranks share a batch
        assert issubclass(runtime, ShardsData)


def test_model_parallel_strategies_do_not_reshard() -> None:
    for name in ("pipeline", "tensor", "hybrid"):
        assert not issubclass(strategies.get(name).runtime, Reshards)


def test_a_bare_register_keeps_the_parts_of_the_strategy_it_extends() -> None:
    from disttrain.strategies.zero import Zero

    class Zero2(Zero):
        name = "zero2_test_only"

    try:
        strategies.register(Zero2)
        kind = strategies.get("zero2_test_only")
        zero = strategies.get("zero")
        assert (kind.settings, kind.cost, kind.layout) == (zero.settings, zero.cost, zero.layout)
        assert kind.cost_model().name == "zero2_test_only"
        assert kind.cost_model().advise_specs()[0] == "zero2_test_only:1"
    finally:
        strategies.STRATEGIES.remove("zero2_test_only")


#: Written into the workers' site directory: each worker process (torchrun sets LOCAL_RANK
#: in workers, not in its agent) notes every disttrain module it imports, as it imports it
#: (workers leave with os._exit: no atexit hook would run).
SITE = """
import os, sys

class _Note:
    # first on sys.meta_path: asked for every module not yet imported; finds none itself
    def find_spec(self, name, path=None, target=None):
        if name.startswith("disttrain"):
            with open(_out, "a") as f:
                f.write(name + "\\n")
        return None

if os.environ.get("LOCAL_RANK") is not None:
    _out = os.path.join(os.environ["DT_MODULES_OUT"], f"{os.getpid()}.txt")
    sys.meta_path.insert(0, _Note())
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["zero", "ps"])
def test_a_worker_never_imports_the_cost_model(tmp_path: Path, name: str) -> None:
    """A real run's workers (torchrun, 2 processes, 2 steps: each worker a fresh
    interpreter, not a fork of a launcher that ran pre-flight's memory plan): the cost
    model (``costing`` and every strategy's cost part) is the lab's, never imported where
    training runs."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITE))
    seen = tmp_path / "modules"
    seen.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), str(SRC)]),
        "DT_MODULES_OUT": str(seen),
    }
    flags = ["--max-steps", "2", "--epochs", "1", "--batch-size", "32", "--no-progress"]
    flags += ["--out", str(tmp_path / "run")]
    nproc = "3" if name == "ps" else "2"  # ps: 2 workers and a server
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", nproc]
    done = subprocess.run(
        [*torchrun, "-m", "disttrain", "train", "--strategy", name, *flags],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    notes = [p.read_text().split() for p in seen.glob("*.txt")]
    assert len(notes) == int(nproc)  # every worker process (ps: its server too)
    for modules in notes:
        assert f"disttrain.strategies.{name}" in modules  # it did train
        cost = [m for m in modules if m == "disttrain.costing" or ".cost." in m]
        assert not cost, cost
