"""Settings: defaults < TOML file < flags, and every bad value is a UsageError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from disttrain import config
from disttrain.comm.errors import UsageError


def test_flags_override_the_file_which_overrides_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("epochs = 3\nlr = 1\nbatch-size = 32\n")
    cfg = config.load({"epochs": 5}, str(path)).train
    assert (cfg.epochs, cfg.lr, cfg.batch_size, cfg.workers) == (5, 1.0, 32, 2)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"workers": 0}, "--workers must be positive"),
        ({"node_rank": 2, "nnodes": 2, "rdzv_endpoint": "h:1"}, "--node-rank 2 is outside 0..1"),
        ({"max_steps": -1}, "--max-steps must be >= 0"),
        ({"optimizer": "rmsprop"}, "--optimizer must be one of"),
        ({"progress": 1}, "setting 'progress' must be bool"),
    ],
)
def test_impossible_values_are_named(flags: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        config.load(flags)


def test_a_section_may_not_redefine_a_setting() -> None:
    @dataclass(frozen=True)
    class Clashing:
        epochs: int = config.opt(1, "again")

        def validate(self) -> None:
            pass

    with pytest.raises(ValueError, match="redefines settings"):
        config.register_section(Clashing)
