"""``python -m disttrain``: the same as the ``disttrain`` command."""

import sys

from disttrain.cli import main

sys.exit(main())
