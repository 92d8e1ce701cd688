"""What one worker process costs in memory: the figures behind launch/memory_plan.py.

    python benchmarks/worker_memory.py            # forked workers (the CPU default)
    python benchmarks/worker_memory.py --threads 2  # exec'd workers

Runs the default ``disttrain train`` with 2 and then 8 workers and samples, while they
train, the proportional set size (``Pss`` of /proc/PID/smaps_rollup: shared pages split
among their users) summed over the job's processes; prints each peak and the cost of one
added worker, (peak(8) - peak(2)) / 6. Linux only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.netcheck import descendants  # noqa: E402  (the repository's /proc walker)


def _pss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                total += sum(int(line.split()[1]) for line in fh if line.startswith("Pss:"))
        except OSError:
            continue
    return total


def peak_mib(workers: int, extra: list[str]) -> int:
    """The job's peak Pss, sampled every 0.3 s while ``--workers N`` trains 300 steps."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "disttrain",
            "train",
            "--workers",
            str(workers),
            "--max-steps",
            "300",
            "--no-progress",
            "--out",
            out,
            *extra,
        ]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _pss_kib(descendants(proc.pid)))
            time.sleep(0.3)
    return peak // 1024


def main() -> int:
    extra = sys.argv[1:]
    two, eight = peak_mib(2, extra), peak_mib(8, extra)
    how = " ".join(extra) or "forked"
    print(
        f"peak Pss: 2 workers {two} MiB, 8 workers {eight} MiB; "
        f"one more worker {(eight - two) / 6:.0f} MiB ({how})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
