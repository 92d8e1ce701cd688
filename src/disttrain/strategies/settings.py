"""A strategy's settings part: what it reads, its own defaults, its checks before any start.

Each strategy file subclasses :class:`StrategySettings` and names it in its registration
(``@register(settings=ZeroSettings)``). Everything here runs in the launcher, before any
process starts: pre-flight (:mod:`disttrain.launch.preflight`) refuses a setting the
chosen strategy does not read, and the strategy's :meth:`~StrategySettings.validate_config`
and :meth:`~StrategySettings.check_resume` refuse what it cannot run (exit code 2).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from torch import nn

from disttrain import collectives
from disttrain.comm.errors import UsageError
from disttrain.config import RunConfig, field_names

__all__ = ["StrategySettings"]


class StrategySettings:
    """The settings a strategy reads, its defaults and its pre-flight checks (classmethods)."""

    #: The settings this strategy reads beyond the always-read ones (``TrainConfig``,
    #: ``DataConfig``): section classes (all their fields) and single field names.
    #: Pre-flight refuses any other setting changed from its default.
    reads_settings: ClassVar[tuple[type[Any] | str, ...]] = ()
    #: Defaults of its own for settings it reads (``{"optimizer": "adam"}``); a given flag
    #: or TOML key wins (``config.choice_defaults``).
    setting_defaults: ClassVar[dict[str, Any]] = {}
    #: The setting a spec's positional value sets in ``compare`` and ``advise``
    #: (``localsgd:16`` -> period; grammar in :mod:`disttrain.strategies.spec`); None: none.
    main_setting: ClassVar[str | None] = None
    #: The runs that cover it, by label: its modes (or what it requires), each the flags it
    #: adds to ``--strategy NAME``; "" is its plain run. The tests build their per-strategy
    #: lists from these (defaults that train, the fault matrix): a strategy declares its own.
    modes: ClassVar[dict[str, tuple[str, ...]]] = {"": ()}

    @classmethod
    def defaults_for(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Its defaults given the run's settings so far (a mode of its own may want its
        own: ps softsync's ``staleness_lr``); :attr:`setting_defaults` unless overridden."""
        del settings
        return dict(cls.setting_defaults)

    @classmethod
    def settings_not_read(cls, config: RunConfig) -> dict[str, str]:
        """Declared settings that ``config``'s other settings make this strategy ignore, each
        with the reason, e.g. ``{"fusion_mb": "with --compression topk:0.01"}``."""
        del config
        return {}

    @classmethod
    def reads(cls, config: RunConfig) -> set[str]:
        """The settings a run with ``config`` reads (always-read ones aside): its own, and
        the chosen algorithm's when it reads ``--algorithm``."""
        names = field_names(cls.reads_settings) - set(cls.settings_not_read(config))
        if "algorithm" in names and config.train.algorithm in collectives.ALGORITHMS:
            names |= set(collectives.ALGORITHMS.get(config.train.algorithm).reads_settings)
        return names

    @classmethod
    def validate_config(cls, config: RunConfig, model: nn.Module) -> None:
        """Raise UsageError for settings this strategy cannot run; called before any process
        starts. By default each worker gets 1/world of every global batch, so the batch
        must split evenly; strategies whose ranks share one batch override this."""
        del model
        world = config.train.world_size
        if config.train.batch_size % world:
            raise UsageError(
                f"--batch-size {config.train.batch_size} is not divisible by the {world} "
                f"workers: use a multiple of {world}"
            )

    @classmethod
    def check_resume(cls, config: RunConfig, model: nn.Module, state: dict[str, Any]) -> None:
        """Raise UsageError if a checkpoint whose worker 0 saved ``state`` cannot resume a
        run of ``config`` (pre-flight, before any process starts); by default any can."""
        del config, model, state
