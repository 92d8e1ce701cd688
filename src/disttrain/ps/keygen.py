"""``python -m disttrain.ps.keygen FILE``: write a new CURVE secret key for --ps-curve-key."""

from __future__ import annotations

import sys

from disttrain.ps.auth import write_key

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Write a new secret key to ``argv[0]`` (owner-only); never overwrite a file."""
    if len(argv) != 1:
        sys.stderr.write("usage: python -m disttrain.ps.keygen FILE\n")
        return 2
    try:
        write_key(argv[0])
    except OSError as exc:
        sys.stderr.write(f"disttrain: error: cannot write {argv[0]}: {exc.strerror}\n")
        return 2
    print(f"wrote a CURVE secret key to {argv[0]}; give every process of the job the same file")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
