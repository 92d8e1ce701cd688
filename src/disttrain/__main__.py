"""``python -m disttrain``: the same as the ``disttrain`` command."""

import os
import sys

from disttrain.cli import main
from disttrain.launch.worker import is_worker

code = main()
if is_worker():
    # A worker's outputs are written and closed by now. Leave without running C++ static
    # destructors: a gloo thread still joinable at interpreter exit calls std::terminate
    # (seen once in CI as "terminate called without an active exception", SIGABRT).
    # ZeroMQ (the parameter server) delivers queued messages when its context ends:
    # end it here, with the servers' linger, since os._exit skips that too.
    zmq = sys.modules.get("zmq")
    if zmq is not None:
        zmq.Context.instance().destroy(linger=5000)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
if code == 1:  # a failed job: the launcher has cleaned up and said why; leave at once
    sys.stdout.flush()  # (the interpreter's teardown of torch took seconds on a loaded host)
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
