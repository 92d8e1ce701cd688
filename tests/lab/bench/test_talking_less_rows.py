"""Every row of ``bench talking-less`` is a valid ``disttrain train`` run (no process started).

A row is the workload's base flags plus its own; the bench would only find a bad one after
the earlier rows' minutes of training. Each row is parsed by train's own parser, loaded
into a config and checked for settings nothing reads (the launcher's first check).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from disttrain import config
from disttrain.lab.bench.talking_less import CONFIGS, base_flags
from disttrain.launch.job import add_arguments
from disttrain.launch.preflight import check_settings_read

ROWS = [(w, label) for w, rows in CONFIGS.items() for label in rows]


@pytest.mark.parametrize(("workload", "label"), ROWS, ids=[f"{w}:{lb}" for w, lb in ROWS])
def test_row_is_a_valid_train_run(workload: str, label: str) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = CONFIGS[workload][label]
    cfg = config.load(vars(parser.parse_args([*base_flags(workload, None), *flags])))
    check_settings_read(cfg)  # raises UsageError, naming the setting, on a row nothing reads
    assert cfg.train.strategy == flags[flags.index("--strategy") + 1]


def test_powersgd_rows_at_rank_2_and_4() -> None:
    # the PowerSGD quality targets: rank 2 and 4 on both workloads, against dense
    for workload in ("digits", "pycode"):
        specs = [
            flags[flags.index("--compression") + 1]
            for flags in CONFIGS[workload].values()
            if "--compression" in flags
        ]
        assert {"powersgd:2", "powersgd:4"} <= set(specs)


def test_held_out_halves_split_the_test_loss(tmp_path: Path) -> None:
    # the two halves' losses, weighted by their windows, are the trainer's own test loss
    import torch

    from disttrain.config import DataConfig
    from disttrain.data import load_dataset
    from disttrain.lab.bench.talking_less import held_out_halves
    from disttrain.models import build_model
    from disttrain.train.trainer import evaluate

    data = load_dataset(DataConfig(dataset="pycode", pycode_chars=30_000, seq_len=64))
    torch.manual_seed(0)
    model = build_model("gpt", data)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    summary = {"config": {"model": "gpt", "pycode_chars": 30_000, "seq_len": 64}}
    first, second = held_out_halves(str(tmp_path), summary)
    half, n = len(data.x_test) // 2, len(data.x_test)
    whole, _ = evaluate(model, data, torch.device("cpu"))
    assert first != second  # two different sets of windows
    assert abs((first * half + second * (n - half)) / n - whole) < 1e-5


def test_max_steps_is_the_diloco_workloads_only() -> None:
    # the other workloads end on their epochs: a --max-steps there would be read by nothing
    from disttrain.comm.errors import UsageError
    from disttrain.lab.bench.talking_less import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for argv in (
        ["--workload", "pycode", "--max-steps", "10"],
        ["--workload", "diloco", "--max-steps", "0"],
    ):
        with pytest.raises(UsageError, match="--max-steps"):
            run(parser.parse_args(argv))
