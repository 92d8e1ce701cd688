"""Nothing a local job opens listens beyond the loopback address."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.netcheck import descendants, listening_addresses

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")


def test_a_local_job_listens_only_on_loopback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "disttrain", "train", "--workers", "2", "--epochs", "30",
         "--no-progress", "--out", str(tmp_path / "o")],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    seen: set[tuple[str, int]] = set()
    try:
        deadline = time.monotonic() + 60
        metrics = tmp_path / "o" / "metrics.jsonl"
        # sample while the workers are training (the metrics file grows)
        while time.monotonic() < deadline and proc.poll() is None:
            seen.update(listening_addresses(descendants(proc.pid)))
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
                break
            time.sleep(0.2)
        assert metrics.exists(), "the job never started training"
        seen.update(listening_addresses(descendants(proc.pid)))
    finally:
        tree = descendants(proc.pid)
        proc.terminate()  # the elastic agent stops its workers on SIGTERM
        try:
            proc.wait(timeout=30)
        finally:
            for pid in tree[1:]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert seen, "gloo always listens for its peers: no listener seen means the check is broken"
    assert all(addr in LOOPBACK for addr, _ in seen), seen
