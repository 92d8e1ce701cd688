"""launch/startup.py: the command's imports run without the cyclic collector, then are
frozen out of its sight; a process that did not turn it off is left as it was. Each case
in a fresh process (the collector's state is the process's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CASE = """
import gc, json
from disttrain.launch import startup
startup.imports_done()  # nobody turned it off: nothing changes
untouched = (gc.isenabled(), gc.get_freeze_count())
startup.begin()
off = gc.isenabled()
import torch  # what the command imports next
startup.imports_done()
print(json.dumps([untouched, off, gc.isenabled(), gc.get_freeze_count()]))
"""


def test_the_imports_are_frozen_and_the_collector_is_back_on() -> None:
    env = {"PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [sys.executable, "-c", _CASE],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    untouched, off, on, frozen = json.loads(done.stdout)
    assert untouched == [True, 0] and off is False and on is True
    assert frozen > 100_000  # torch's objects (about 170,000), never walked again
