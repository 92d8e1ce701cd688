"""Every setting is owned: each strategy x each setting, refused exactly when nothing reads it.

For every registered strategy and every settings field, a config is built with
that one field at a valid non-default value (derived from the field's type and
choices; ``VALUES`` only for fields that need a special value, ``COMPANIONS``
for the settings that make a conditional field matter, e.g. ``--consensus-step``
needs ``--topology ring``). Pre-flight's unused-settings check must refuse the
field exactly when the strategy does not read it. ``OWNERS`` is the ownership
written out: a new setting fails here until it is given an owner.
tests/strategies/test_settings_read.py checks the declarations against what the
strategies' code really reads; tests/test_bad_inputs.py runs refusals through the CLI.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

import disttrain.strategies  # noqa: F401  (every strategy registers its settings section)
from disttrain import collectives, config
from disttrain.comm.errors import UsageError
from disttrain.launch.preflight import check_settings_read, unread_settings
from disttrain.strategies import STRATEGIES

PIPELINES = {"pipeline", "hybrid"}
#: Who reads each setting that not every run reads (with its COMPANIONS set).
_OWNED_BY: list[tuple[str, set[str]]] = [
    ("algorithm", {"allreduce", "decentralized", "diloco", "hybrid", "localsgd", "tensor", "zero"}),
    ("fusion_mb overlap accumulate", {"allreduce", "zero"}),
    ("zero_stage", {"zero"}),
    ("compression error_feedback", {"allreduce", "decentralized"}),
    ("powersgd_start_step", {"allreduce"}),
    ("period warmup_sync_steps adaptive_lr_scale", {"localsgd", "diloco"}),
    ("average_optimizer_state", {"localsgd"}),
    ("outer_lr outer_momentum outer_dtype fragments fragment_mix", {"diloco"}),
    (
        "topology consensus_step active_warmup_steps active_workers momentum_correction",
        {"decentralized"},
    ),
    (
        "servers ps_mode staleness_bound softsync staleness_lr push_lr_share straggler "
        "ps_address ps_heartbeat ps_worker_timeout ps_curve_key",
        {"ps"},
    ),
    ("stages", {"pipeline"}),
    ("microbatches schedule virtual_stages balance split_points recompute", PIPELINES),
    ("tensor_mode tp_plan", {"tensor", "hybrid"}),
    ("dp pp tp", {"hybrid"}),
]
#: Each algorithm's own settings (its kind's section), from the registry: read with that
#: algorithm chosen, by the strategies that read --algorithm.
ALGORITHM_SETTINGS = {
    s: a for a, kind in collectives.ALGORITHMS.items() for s in kind.reads_settings
}
OWNERS: dict[str, set[str]] = {n: owners for names, owners in _OWNED_BY for n in names.split()}
OWNERS.update({s: OWNERS["algorithm"] for s in ALGORITHM_SETTINGS})

#: Values the type alone cannot give (free-form strings, files).
VALUES: dict[str, Any] = {
    "model": "cnn",
    "dataset": "synthetic",
    "loss": "mymodule:my_loss",
    "metric": "mymodule:my_metric",
    "out": "elsewhere",
    "rdzv_endpoint": "host:29500",
    "rdzv_id": "job-7",
    "inject_fault": "slow:2:rank=0",
    "resume": "an-earlier-run",
    "algorithm": "ring",
    "inter_algorithm": "tree",
    "allreduce_table": "65536:tree,*:ring",
    "compression": "topk:0.1",
    "balance": "time",
    "split_points": "3",
    "tp_plan": '{"0": "colwise"}',
    "schedule": "1f1b",
    "straggler": "1:2",
    "ps_address": "127.0.0.2",
    "tensorboard": "tb-logs",
    "ray_address": "127.0.0.1:6379",
    "max_workers": 3,  # above the 2 workers (live grow)
    "join": "runs/x",
}

#: The loss scaler's settings (read with fp16 only).
FP16_ONLY = (
    "loss_scale",
    "scale_growth",
    "scale_backoff",
    "scale_growth_interval",
    "max_skipped_steps",
)
#: Settings a conditional field needs before anything reads it.
COMPANIONS: dict[str, dict[str, Any]] = {
    "nnodes": {"rdzv_endpoint": "host:29500"},
    "node_rank": {"nnodes": 2, "rdzv_endpoint": "host:29500"},
    "max_restarts": {"checkpoint_every": 5},
    "async_checkpoint": {"checkpoint_every": 5},
    "ray_address": {"launcher": "ray"},
    "error_feedback": {"compression": "topk:0.1"},
    "powersgd_start_step": {"compression": "powersgd:2"},
    "fragment_mix": {"fragments": 2},
    "consensus_step": {"topology": "ring", "workers": 4},
    "active_workers": {"active_warmup_steps": 2},
    "staleness_bound": {"ps_mode": "ssp"},
    "softsync": {"ps_mode": "softsync"},
    "staleness_lr": {"ps_mode": "async"},
    "push_lr_share": {"ps_mode": "async"},
    "tensor_mode": {"tp": 2},
    "tp_plan": {"tp": 2},
    **{n: {"pp": 2} for n in ("microbatches", "schedule", "balance", "split_points", "recompute")},
    "virtual_stages": {"pp": 2, "schedule": "interleaved"},
    # torch's DataLoader reads a user's data set only (DataConfig.not_read)
    "loader_workers": {"dataset": "mymodule:my_dataset"},
    # a data set's own shape (DataConfig.not_read: refused with another data set)
    **{
        n: {"dataset": "synthetic"}
        for n in ("synthetic_size", "synthetic_dim", "synthetic_classes")
    },
    "pycode_chars": {"dataset": "pycode"},
    "seq_len": {"dataset": "pycode"},
    "rdzv_id": {"nnodes": 2, "rdzv_endpoint": "host:29500"},
    # a run setting another one switches on (TrainConfig.not_read: refused without it)
    **{n: {"precision": "fp16"} for n in FP16_ONLY},
    "base_batch_size": {"lr_scaling": "linear"},
    "momentum": {"optimizer": "momentum"},  # diloco's own default optimizer is adam
    "lr_gamma": {"lr_schedule": "exponential"},
    "lr_step_epochs": {"lr_schedule": "step"},
    "heartbeat_timeout": {"min_workers": 1},  # live shrink's and grow's
    # an algorithm's own setting (hierarchical's inter_algorithm): with that algorithm
    **{s: {"algorithm": a} for s, a in ALGORITHM_SETTINGS.items()},
}


def _value(name: str, f: dataclasses.Field[Any], tmp: Path) -> Any:
    """A valid value of setting ``name`` other than its default."""
    if name in VALUES:
        return VALUES[name]
    if name == "timeline":
        return str(tmp / "trace.json")
    if name == "ps_curve_key":
        from disttrain.ps.auth import write_key

        path = tmp / "curve.key"
        if not path.exists():
            write_key(str(path))
        return str(path)
    default = f.default
    choices = f.metadata.get("choices")
    if choices:
        return next(c for c in choices if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default / 2 if default else 0.5  # halves stay inside every (0, x] range
    raise AssertionError(f"add a valid non-default value for {name!r} to VALUES")


def _config(strategy: str, name: str, tmp: Path) -> config.RunConfig:
    _, f = config.section_fields()[name]
    flags = {**COMPANIONS.get(name, {}), name: _value(name, f, tmp), "strategy": strategy}
    return config.load(flags)


def test_every_setting_is_always_read_or_owned_by_a_strategy() -> None:
    fields = config.section_fields()
    optional = {n for n in fields if not config.always_read(n)}
    assert optional == set(OWNERS), "give each new setting its owners in OWNERS"
    for name in OWNERS:
        assert OWNERS[name], f"{name}: a setting nothing reads"
    # the always-read sections are the run's own: what, on what data, how
    for name in ("workers", "lr", "precision", "checkpoint_every", "nnodes", "dataset"):
        assert config.always_read(name)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_a_changed_setting_is_refused_exactly_when_the_strategy_does_not_read_it(
    strategy: str, tmp_path: Path
) -> None:
    cls = STRATEGIES[strategy].settings
    wrong: list[str] = []
    checked = 0
    for name in config.section_fields():
        if name == "strategy":
            continue
        cfg = _config(strategy, name, tmp_path)
        assert name in config.changed_settings(cfg), name  # the value really is non-default
        refused = name in unread_settings(cfg)
        reads = config.always_read(name) or strategy in OWNERS[name]
        declared = config.always_read(name) or name in cls.reads(cfg)
        checked += 1
        if refused == reads or declared != reads:
            wrong.append(f"{name}: refused={refused} declared={declared} owners say {reads}")
    assert checked > 80
    assert not wrong, f"--strategy {strategy}:\n" + "\n".join(wrong)


def test_the_refusal_names_the_flag_the_strategy_and_who_reads_it() -> None:
    cfg = config.load({"strategy": "localsgd", "accumulate": 4})
    with pytest.raises(UsageError) as info:
        check_settings_read(cfg)
    assert (
        str(info.value)
        == "--accumulate is not used by --strategy localsgd (used by: allreduce, zero)"
    )
    # a boolean switched off is named as typed; a conditional refusal names its condition
    cfg = config.load({"compression": "topk:0.01", "overlap": False})
    assert unread_settings(cfg) == {
        "overlap": "--no-overlap is not used by --strategy allreduce with --compression "
        "topk:0.01 (one payload per peer after backward, unfused)"
    }


@pytest.mark.parametrize(
    ("flags", "unread"),
    [
        ({"strategy": "ps", "compression": "topk:0.01"}, {"compression"}),
        ({"strategy": "localsgd", "accumulate": 4}, {"accumulate"}),
        # a sparse compressor exchanges whole payloads after backward: nothing fused or overlapped
        (
            {
                "compression": "topk:0.01",
                "fusion_mb": 1.0,
                "overlap": False,
                "accumulate": 2,
                "algorithm": "ring",
            },
            {"fusion_mb", "overlap", "accumulate", "algorithm"},
        ),
        # a cast rides the reducer: fusion, overlap, accumulation and the algorithm all hold
        (
            {
                "compression": "fp16",
                "fusion_mb": 1.0,
                "overlap": False,
                "accumulate": 2,
                "algorithm": "ring",
            },
            set(),
        ),
        ({"compression": "bf16", "error_feedback": False}, {"error_feedback"}),
        ({"strategy": "pipeline", "schedule": "none", "microbatches": 2}, {"microbatches"}),
        ({"strategy": "hybrid", "tp": 2, "schedule": "1f1b"}, {"schedule"}),
        ({"strategy": "pipeline", "schedule": "zb1", "virtual_stages": 3}, {"virtual_stages"}),
        ({"strategy": "pipeline", "schedule": "interleaved", "virtual_stages": 3}, set()),
        (
            {"strategy": "decentralized", "topology": "ring", "workers": 2, "consensus_step": 0.3},
            {"consensus_step"},
        ),
        (
            {
                "strategy": "decentralized",
                "topology": "ring",
                "workers": 4,
                "compression": "topk:0.1",
                "error_feedback": False,
            },
            {"error_feedback"},
        ),
    ],
)
def test_the_cases_of_the_issue(flags: dict[str, Any], unread: set[str]) -> None:
    assert set(unread_settings(config.load(flags))) == unread


def test_a_setting_given_at_its_default_value_is_refused_too(tmp_path: Any) -> None:
    """What counts is that the flag or TOML key was given, not that its value changed."""
    default = config.section_fields()["microbatches"][1].default
    given = config.load({"strategy": "ps", "microbatches": default})
    assert set(unread_settings(given)) == {"microbatches"}
    toml = tmp_path / "run.toml"
    toml.write_text(f'strategy = "ps"\nmicrobatches = {default}\n')
    assert set(unread_settings(config.load({}, str(toml)))) == {"microbatches"}
    # a component's own default is not given: the user named only the component
    assert "optimizer" not in unread_settings(config.load({"strategy": "diloco"}))
