"""L0: byte counts as people read them (decimal units, as `ls -h --si` and network rates)."""

from __future__ import annotations

__all__ = ["human_bytes"]

_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def human_bytes(nbytes: float) -> str:
    """``402 B``, ``25.8 MB``, ``1.2 GB``: three significant figures, whole bytes below 1 kB."""
    for scale, unit in _UNITS:
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
