"""``python -m disttrain``: the same as the ``disttrain`` command."""

import os
import sys

from disttrain.cli import main
from disttrain.launch.worker import is_worker, leave

code = main()
if is_worker():
    leave(code)
if code == 1:  # a failed job: the launcher has cleaned up and said why; leave at once
    sys.stdout.flush()  # (the interpreter's teardown of torch took seconds on a loaded host)
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
