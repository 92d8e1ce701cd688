"""``python -m disttrain``: the same as the ``disttrain`` command."""

from disttrain.cli import console

console()
