"""The declarations checked against reality: a strategy's code reads no setting it does not declare.

Each strategy runs a few real steps on real ranks with a config whose sections
record every field read from them (its checks, setup, steps, finish, evaluation
and state, and everything they call: the reducer, the compressors, the inner
pipeline or tensor strategy of a mesh; not ``summary()``, which only echoes
settings into summary.json). A setting read that is neither always read nor in
``StrategySettings.reads(cfg)`` would be one pre-flight refuses although it matters: the
test fails naming it. Also run with settings that switch parts off
(a sparse compressor on allreduce must not read ``--fusion-mb``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from disttrain import config, strategies
from tests.harness import SharedWorlds


class _Recording:
    """A settings section that notes the name of every field read from it."""

    def __init__(self, section: Any, fields: set[str], seen: set[str]) -> None:
        self._section, self._fields, self._seen = section, fields, seen

    def __getattr__(self, name: str) -> Any:
        if name in self._fields:
            self._seen.add(name)
        return getattr(self._section, name)


def _read_by_a_run(flags: dict[str, Any], steps: int) -> tuple[list[str], list[str]] | None:
    """(settings read but not declared, all settings read) on this rank (None on a server)."""
    import dataclasses

    import torch.distributed as dist

    from disttrain import config, strategies
    from disttrain.comm import world
    from disttrain.strategies.capabilities import data_shard
    from disttrain.train.metrics import Timers
    from disttrain.train.step import StepRunner
    from disttrain.train.trainer import loss_fn

    real = config.load({"seed": 0, **flags})
    seen: set[str] = set()
    cfg = config.RunConfig(
        {
            cls: _Recording(s, {f.name for f in dataclasses.fields(cls)}, seen)
            for cls, s in real.sections.items()
        }
    )
    kind = strategies.get(real.train.strategy)
    cls = kind.settings
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8),
        torch.nn.ReLU(),
        torch.nn.Linear(8, 8),
        torch.nn.ReLU(),
        torch.nn.Linear(8, 4),
    )
    cls.validate_config(cfg, model)
    strategy = kind.build(cfg, world.current(), loss_fn)
    model = strategy.prepare_model(model, torch.randn(cfg.train.batch_size, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    strategy.setup(model, optimizer)
    if not strategy.roles.is_worker:  # a parameter server serves until the workers are done
        strategy.roles.serve()
        return None
    strategy.roles.limits(1, steps)
    runner = StepRunner(strategy, optimizer, real.train, Timers(), None, dist.get_rank())
    gen = torch.Generator().manual_seed(100 + data_shard(strategy)[0])
    for step in range(1, steps + 1):
        x, y = torch.randn(8, 4, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        runner.run(step, x, y)
        strategy.step_metrics()
    strategy.finish()
    strategy.eval_model()
    strategy.state_dict()
    # summary() is left out: it echoes settings into summary.json (decentralized reports
    # --active-workers even without a warm-up), which changes nothing the run does
    unread = set(cls.settings_not_read(real))
    declared = cls.reads(real) | {n for n in config.section_fields() if config.always_read(n)}
    assert not unread & declared
    return sorted(seen - declared), sorted(seen)


#: (flags, ranks, a setting the run must be seen to read: the recording is not blind)
CASES: dict[str, tuple[dict[str, Any], int, str]] = {
    "allreduce": ({"strategy": "allreduce", "algorithm": "ring"}, 2, "fusion_mb"),
    "allreduce topk": ({"strategy": "allreduce", "compression": "topk:0.5"}, 2, "error_feedback"),
    "allreduce fp16": (
        {"strategy": "allreduce", "compression": "fp16", "accumulate": 2},
        2,
        "accumulate",
    ),
    "localsgd": ({"strategy": "localsgd", "period": 2, "warmup_sync_steps": 1}, 2, "period"),
    "allreduce powersgd": (
        {"strategy": "allreduce", "compression": "powersgd:2", "powersgd_start_step": 1},
        2,
        "powersgd_start_step",
    ),
    "diloco streaming": ({"strategy": "diloco", "period": 2, "fragments": 2}, 2, "fragment_mix"),
    "decentralized ring": (
        {
            "strategy": "decentralized",
            "topology": "ring",
            "compression": "topk:0.5",
            "workers": 3,
            "batch_size": 48,
        },
        3,
        "consensus_step",
    ),
    "decentralized all": (
        {"strategy": "decentralized", "compression": "onebit:0.01", "active_warmup_steps": 1},
        2,
        "active_workers",
    ),
    "ps sync": ({"strategy": "ps", "workers": 2}, 3, "ps_mode"),
    "pipeline": ({"strategy": "pipeline", "schedule": "1f1b", "microbatches": 2}, 2, "schedule"),
    "tensor": ({"strategy": "tensor"}, 2, "tensor_mode"),
    "hybrid pp": ({"strategy": "hybrid", "pp": 2, "workers": 2, "microbatches": 2}, 2, "pp"),
}


def _settings(flags: tuple[str, ...]) -> dict[str, Any]:
    """A mode's command-line flags (``("--tp", "2")``) as settings, typed as their defaults."""
    fields = config.section_fields()
    out: dict[str, Any] = {}
    for given, text in zip(flags[::2], flags[1::2], strict=True):
        name = given[2:].replace("-", "_")
        out[name] = type(fields[name][1].default)(text)
    return out


#: Every strategy that reads --algorithm, in its first mode, with an algorithm that has a
#: setting of its own: the run must read it (a strategy that looked its algorithm up by
#: name alone would run hierarchical with its default --inter-algorithm, silently)
CASES.update(
    {
        f"{name} hierarchical": (
            {
                "strategy": name,
                **_settings(next(iter(kind.settings.modes.values()))),
                "algorithm": "hierarchical",
                "inter_algorithm": "tree",
            },
            2,
            "inter_algorithm",
        )
        for name, kind in strategies.STRATEGIES.items()
        if "algorithm" in config.field_names(kind.settings.reads_settings)
    }
)


#: the cases run one after another in one world per size (2 spawns instead of 12: a
#: spawn's start-up costs more than a case); each builds its own model and strategy
RUNS = SharedWorlds(
    {case: (n, _read_by_a_run, (flags, 3)) for case, (flags, n, _) in CASES.items()}, timeout=400
)


@pytest.mark.timeout(450)  # the first case of a size runs that world's cases
@pytest.mark.parametrize("case", list(CASES))
def test_a_strategy_reads_only_the_settings_it_declares(case: str) -> None:
    _, _, must_see = CASES[case]
    results = RUNS.get(case)
    workers = [r for r in results if r is not None]
    assert workers
    for rank, (undeclared, seen) in enumerate(workers):
        assert not undeclared, f"{case}: rank {rank} read undeclared settings {undeclared}"
        assert must_see in seen, f"{case}: rank {rank} read only {seen}"
