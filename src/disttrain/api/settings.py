"""A run's settings from ``dt.distribute``'s keywords, checked as the command line checks them.

The keywords are the flags' names with underscores (``zero_stage=3``, ``ps_mode="async"``).
A strategy's own settings pass when the strategy reads them, as on the command line
(pre-flight's ``check_settings_read``); of the trainer's own settings only those the
step engine reads here are taken: what a user's script decides itself (epochs, the model,
the data set, the output folder, the learning-rate schedule) is refused with one line
saying where it goes instead.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from disttrain.comm.errors import UsageError

__all__ = ["ENGINE_SETTINGS", "run_config"]

#: TrainConfig's fields the step engine of a script's run reads (the rest are the
#: trainer's: its loop, data, model, outputs and launcher)
ENGINE_SETTINGS = frozenset(
    {
        "strategy", "algorithm", "batch_size", "seed", "device", "backend", "timeout",
        "check_collectives", "threads", "inject_fault", "check_finite", "precision",
        "loss_scale", "scale_growth", "scale_backoff", "scale_growth_interval",
        "max_skipped_steps",
    }
)  # fmt: skip
#: the trainer's optimizer settings: read only when ``optimizer`` is None (the default one)
OPTIMIZER_SETTINGS = frozenset({"optimizer", "lr", "momentum", "weight_decay"})
#: where the trainer-only settings go in a script of one's own
_INSTEAD = {
    "epochs": "your loop's range",
    "max_steps": "your loop's range",
    "model": "the model you pass",
    "dataset": "run.loader(dataset, ...)",
    "workers": "the launcher's process count (torchrun --nproc-per-node, disttrain run -np)",
}


def _refuse_trainer_only(settings: dict[str, Any], own_optimizer: bool) -> None:
    from disttrain import config as config_mod

    fields = config_mod.section_fields()
    for name in settings:
        section = fields[name][0] if name in fields else None
        if section is config_mod.DataConfig:
            raise UsageError(f"dt.distribute: {name}= is the trainer's; pass run.loader(dataset)")
        if section is not config_mod.TrainConfig or name in ENGINE_SETTINGS:
            continue
        if name in OPTIMIZER_SETTINGS:
            if own_optimizer:
                raise UsageError(
                    f"dt.distribute: {name}= configures the default optimizer, but an "
                    "optimizer was given: set it on your optimizer"
                )
            continue
        instead = _INSTEAD.get(name, "the disttrain train command")
        raise UsageError(f"dt.distribute: {name}= is not a setting of a script's run ({instead})")


def _default_batch(cfg: Any) -> Any:
    """A global batch that splits over the run's workers when none was given (64 rounded
    up): the strategies' checks need one; ``run.loader`` takes the one it is given."""
    from disttrain import config as config_mod

    if "batch_size" in config_mod.changed_settings(cfg):
        return cfg
    workers = cfg.train.world_size
    batch = -(-64 // workers) * workers
    tc = dataclasses.replace(cfg.train, batch_size=batch)
    return config_mod.RunConfig({**cfg.sections, config_mod.TrainConfig: tc}, cfg.given)


def run_config(strategy: str, settings: dict[str, Any], own_optimizer: bool, size: int) -> Any:
    """The RunConfig of a script's run over a process group of ``size`` processes."""
    import disttrain.strategies  # noqa: F401  (every strategy registers its settings section)
    from disttrain import registry
    from disttrain.launch.entry import fit_to_group, resolve_config
    from disttrain.launch.preflight import check_settings_read

    registry.load_plugins()  # and the plug-ins'
    # a dict (tp_plan={...}) is the JSON object its flag takes (--tp-plan '{...}')
    flags = {
        k.replace("-", "_"): json.dumps(v) if isinstance(v, dict) else v
        for k, v in settings.items()
    }
    cfg = resolve_config({"strategy": strategy, **flags})
    _refuse_trainer_only(flags, own_optimizer)
    cfg = _default_batch(fit_to_group(cfg, size))
    check_settings_read(cfg)
    return cfg
