"""``python -m disttrain``: the same as the ``disttrain`` command.

A worker of a job (what our launcher starts, and ``torchrun -m disttrain train``) goes
straight to its training: from here to ``loss.backward()`` are 7 calls
(:func:`disttrain.launch.worker.run_worker`; docs/architecture.md).
"""

import sys

from disttrain.cli import console, trains_as_worker, worker_settings

if trains_as_worker(sys.argv[1:]):
    from disttrain.launch.worker import leave, run_worker

    leave(run_worker(*worker_settings(sys.argv[1:])))
console()
