"""Settings: defaults < TOML file < flags, and every bad value is a UsageError."""

from __future__ import annotations

import dataclasses
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


def test_the_data_settings_are_one_section_with_the_same_flags() -> None:
    cfg = config.load({"dataset": "synthetic", "synthetic_size": 100, "seq_len": 8})
    assert cfg.data == config.DataConfig("synthetic", synthetic_size=100, seq_len=8)
    assert cfg.get("synthetic_size") == 100 and cfg.to_dict()["dataset"] == "synthetic"
    with pytest.raises(UsageError, match="--synthetic-dim must be positive"):
        config.load({"synthetic_dim": 0})


def test_models_and_optimizers_are_registries_whose_unknown_names_list_the_choices() -> None:
    import torch

    from disttrain.data import load_dataset
    from disttrain.models import MODELS, build_model
    from disttrain.train.optimizers import OPTIMIZERS, make_optimizer

    f = dataclasses.fields(config.TrainConfig)
    choices = next(x for x in f if x.name == "optimizer").metadata["choices"]
    assert tuple(OPTIMIZERS.names()) == choices  # the flag's choices are the registry's
    with pytest.raises(UsageError, match="--optimizer 'lbfgs': unknown optimizer; choose one"):
        OPTIMIZERS.get("lbfgs")
    params = [torch.nn.Parameter(torch.zeros(2))]
    tc = config.load({"optimizer": "momentum", "momentum": 0.5, "lr": 0.1}).train
    opt = make_optimizer(params, tc)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.5
    assert MODELS.names() == ["cnn", "gpt", "gpt2-small", "mlp"]
    with pytest.raises(UsageError, match="choose one of cnn, gpt, gpt2-small, mlp"):
        build_model("resnet", load_dataset("digits"))
    # gpt takes its context from the data: one window of --seq-len tokens
    text = load_dataset(config.DataConfig("pycode", seq_len=16, pycode_chars=4000))
    assert build_model("gpt", text).state_dict()["0.pos.weight"].shape[0] == 16


def test_a_chosen_compressor_gives_its_defaults_and_given_flags_win() -> None:
    import disttrain.compression
    import disttrain.strategies  # noqa: F401

    sparse = config.load({"strategy": "decentralized", "compression": "onebit:0.01"}).train
    assert (sparse.optimizer, sparse.lr) == ("sgd", 0.5)
    assert config.load({"compression": "topk:0.1", "lr": 0.3}).train.lr == 0.3
    # an lr default is meant for the component's optimizer: a given optimizer drops it too
    given = config.load({"compression": "topk:0.01", "optimizer": "momentum"}).train
    assert (given.optimizer, given.lr) == ("momentum", config.TrainConfig.lr)
    dense = config.load({"compression": "fp16"}).train  # a cast: the run's defaults stay
    assert (dense.optimizer, dense.lr) == (config.TrainConfig.optimizer, config.TrainConfig.lr)


def test_where_two_components_default_one_setting_the_strategy_wins() -> None:
    import disttrain.compression  # noqa: F401
    from disttrain.config import choice_defaults, section_fields
    from disttrain.strategies import STRATEGIES

    diloco = STRATEGIES.get("diloco").settings.setting_defaults  # adam at 0.003; topk: sgd at 0.5
    got = choice_defaults({"strategy": "diloco", "compression": "topk:0.1"}, section_fields())
    assert (got["optimizer"], got["lr"]) == (diloco["optimizer"], diloco["lr"]) != ("sgd", 0.5)
    # a given optimizer settles it: a component's lr stays only if tuned with that one
    given = {"strategy": "diloco", "compression": "topk:0.1", "optimizer": "momentum"}
    assert choice_defaults(given, section_fields())["lr"] == config.OPTIMIZER_LR["momentum"]
    given["optimizer"] = "sgd"  # top-k's own optimizer: its lr, not diloco's
    assert choice_defaults(given, section_fields())["lr"] == 0.5


def test_a_strategy_default_may_depend_on_its_mode_and_a_flag_wins() -> None:
    import disttrain.strategies  # noqa: F401  (registers the ps section)

    # ps softsync divides each update's lr by its staleness unless told otherwise
    assert config.load({"strategy": "ps", "ps_mode": "softsync"}).get("staleness_lr") is True
    off = config.load({"strategy": "ps", "ps_mode": "softsync", "staleness_lr": False})
    assert off.get("staleness_lr") is False
    for mode in ("sync", "async", "ssp"):
        assert config.load({"strategy": "ps", "ps_mode": mode}).get("staleness_lr") is False


def test_the_lr_default_follows_the_optimizer_after_the_components_and_a_flag_wins() -> None:
    import disttrain.compression
    import disttrain.strategies  # noqa: F401

    for optimizer, lr in config.OPTIMIZER_LR.items():
        assert config.load({"optimizer": optimizer}).train.lr == lr
    assert config.load({"optimizer": "adam", "lr": 0.01}).train.lr == 0.01
    # a strategy's lr was tuned with its optimizer: kept when that optimizer is given
    assert config.load({"strategy": "diloco", "optimizer": "adam"}).train.lr == 0.003
    assert config.load({"strategy": "diloco", "optimizer": "sgd"}).train.lr == 0.05
    assert config.load({"compression": "topk:0.01", "optimizer": "adam"}).train.lr == 0.001
