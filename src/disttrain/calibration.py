"""The calibrated constants of the cost model on one machine, and their file (cached per machine).

``disttrain advise --calibrate`` measures and fits them (:mod:`disttrain.lab.calibration`,
:mod:`disttrain.lab.calibrate`); :func:`current` reads this machine's file, or gives the
built-in defaults, which say so in their ``source``. The launcher reads them too, to
choose ``--algorithm auto``'s table before any worker starts (:mod:`disttrain.costing`):
where this machine has no file it uses :func:`reference`, the constants calibrated on the
project's reference machine (2 cores, the CI kind), shipped with the package, and says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from disttrain.config import cache_dir

__all__ = [
    "DEFAULT_PATH",
    "REFERENCE_PATH",
    "Calibration",
    "current",
    "for_choosing",
    "mine",
    "reference",
]

#: Where ``disttrain advise --calibrate`` writes, and ``advise`` reads, by default.
DEFAULT_PATH = os.path.join(cache_dir(), "calibration.json")


@dataclass(frozen=True)
class Calibration:
    """Constants of one machine. Times in seconds; ``loopback`` maps ranks -> (α, β, γ)."""

    alpha: float = 20e-6  # per message
    beta: float = 1 / 1.0e9  # per byte on a link
    gamma: float = 1 / 2.0e9  # per byte added in memory
    mu: float = 1 / 5.0e9  # per byte copied by one thread (shared-memory collectives)
    seconds_per_flop: float = 1 / 20e9  # forward+backward
    seconds_per_param: float = 5e-9  # optimizer step and per-step fixed work per parameter
    # per-step framework work outside forward/backward and the optimizer (the data loader's
    # batch, zero_grad, the trainer's hooks and meters): fixed per step, whatever the model
    seconds_per_step: float = 0.0
    seconds_per_encode: float = 2e-9  # compress, per gradient entry (threshold scan, residual)
    seconds_per_decode: float = 1e-9  # decode one peer's payload, per gradient entry (scatter)
    seconds_per_encode_sent: float = 1e-6  # compress, per entry sent (index coding)
    seconds_per_decode_sent: float = 1e-6  # decode one peer's payload, per entry it sent
    cores: int = 1
    colocation: dict[str, float] = field(default_factory=dict)  # ranks on one host -> slowdown
    loopback: dict[str, list[float]] = field(default_factory=dict)  # ranks -> [α, β, γ]
    # ranks -> [α per barrier, μ per byte copied by all ranks]: a shared-memory collective's
    # barrier wakes every rank (a context switch each once ranks outnumber cores) and its
    # copies share the cores, neither of which the one-thread μ or loopback's α sees
    shared_memory: dict[str, list[float]] = field(default_factory=dict)
    # ranks -> seconds a synchronous data-parallel step at that many ranks takes beyond its
    # modelled compute and collective: the ranks' compute skew (the collective starts when
    # the slowest arrives), copies into and out of fusion buckets, caches gone cold. Left
    # out, every data-parallel step was under-predicted (by 12-25 %, 2026-11-25)
    sync: dict[str, float] = field(default_factory=dict)
    source: str = "built-in defaults (not calibrated: run `disttrain advise --calibrate`)"
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def defaults(cls) -> Calibration:
        return cls()

    def colocation_factor(self, ranks_per_host: int) -> float:
        """How much slower compute runs with this many ranks sharing one host's cores."""
        if ranks_per_host <= 1:
            return 1.0
        measured = self.colocation.get(str(ranks_per_host))
        if measured is not None:
            return measured
        return max(1.0, ranks_per_host / max(1, self.cores))

    def sync_seconds(self, ranks: int) -> float:
        """A synchronous step's wait beyond its modelled collective at ``ranks`` ranks: the
        calibrated value of the closest rank count measured, 0 for one rank or uncalibrated."""
        if ranks <= 1 or not self.sync:
            return 0.0
        key = min(self.sync, key=lambda k: (abs(int(k) - ranks), int(k)))
        return self.sync[key]

    def loopback_link(self, ranks: int) -> tuple[float, float, float]:
        """(α, β, γ) fitted over loopback with ``ranks`` local ranks, else the closest fitted."""
        if not self.loopback:
            return self.alpha, self.beta, self.gamma
        key = min(self.loopback, key=lambda k: (abs(int(k) - ranks), int(k)))
        a, b, g = self.loopback[key]
        return a, b, g

    def shm_link(self, ranks: int) -> tuple[float, float, float] | None:
        """(α per barrier, α per inner barrier, μ) fitted for ``ranks`` ranks on shared
        memory, else the closest fitted; None if none was (then a barrier pays loopback's α
        and a copy the one-thread μ). A calibration from before the inner barriers' own
        constant (two values) prices them as the others."""
        if not self.shared_memory:
            return None
        key = min(self.shared_memory, key=lambda k: (abs(int(k) - ranks), int(k)))
        return self.shm_constants(key)

    def shm_constants(self, key: str) -> tuple[float, float, float]:
        """(α, inner α, μ) of ``shared_memory[key]``, a two-value entry read as (α, α, μ)."""
        fitted = self.shared_memory[key]
        if len(fitted) == 2:
            return fitted[0], fitted[0], fitted[1]
        a, inner, m = fitted
        return a, inner, m

    def save(self, path: str) -> None:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        with open(path, "w") as fh:
            json.dump(asdict(self), fh, indent=1)

    @classmethod
    def load(cls, path: str) -> Calibration:
        """Read a calibration file; ValueError (one line) if it is not one."""
        try:
            with open(path) as fh:
                raw = json.load(fh)
        except FileNotFoundError:
            raise ValueError(f"calibration file {path} does not exist") from None
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"calibration file {path} is not readable JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"calibration file {path}: expected a JSON object")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"calibration file {path}: unknown keys {', '.join(unknown)}")
        try:
            cal = cls(**raw)
        except TypeError as exc:
            raise ValueError(f"calibration file {path}: {exc}") from None
        rates = "alpha beta gamma mu seconds_per_flop seconds_per_param seconds_per_step"
        for name in rates.split():
            value = getattr(cal, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"calibration file {path}: {name} must be a number >= 0")
        return cal


#: The reference machine's calibration, shipped in the package (its ``source`` says whose).
REFERENCE_PATH = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "reference_calibration.json"
)


def reference() -> Calibration:
    """The constants calibrated on the project's reference machine (2 cores, the CI kind):
    a better guess than the built-in round numbers for ``--algorithm auto`` on a machine
    that was never calibrated, and its ``source`` says it is not this machine's."""
    return Calibration.load(REFERENCE_PATH)


def mine() -> Calibration | None:
    """This machine's calibration (:data:`DEFAULT_PATH`), None if it has none (or a file
    that is not one)."""
    if not os.path.exists(DEFAULT_PATH):
        return None
    try:
        return Calibration.load(DEFAULT_PATH)
    except ValueError:
        return None


def for_choosing(hosts: int = 1) -> Calibration:
    """The constants ``--algorithm auto``'s table is chosen with: this machine's on one host,
    else (or without a file) the reference's, so that a multi-node job's launchers, each on
    its own machine, all choose the same table."""
    return (mine() if hosts <= 1 else None) or reference()


def current() -> Calibration:
    """This machine's calibration if it has one, else the built-in defaults (their
    ``source`` says they are not calibrated)."""
    return mine() or Calibration.defaults()
