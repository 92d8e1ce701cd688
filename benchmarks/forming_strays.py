"""4-rank formations beside a stray dialler, without and with the new tries (issue 51).

    .venv/bin/python benchmarks/forming_strays.py --formations 100 --odds 0.2

In one world of ``--ranks`` processes, each formation: every rank leaves its group; rank 0
(the stray: tests/comm/strays.py) dials each other rank's new gloo listener with
probability ``--odds`` (every small sequence number, then closed: the shape of a dying
group's pair whose connect lands on a recycled port) and only then forms its own part,
so a dialled listener holds the stray's connections before any peer's; the ranks form
the group (``world.init``) and check it with an all_reduce. With ``--race`` rank 0 forms
at once and a thread of it dials each listener (its own too) the moment it appears,
racing the real peers (it wins less often). A formation failed if any rank's did. Run
once with one try (``forming.TRIES = 1``: the library before issue 51) and once with
three; prints the failures of each and the retry lines seen. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.comm import strays  # noqa: E402  (the tests' stray dialler)


def _stray(pids: list[int], before: dict[int, set], size: int, odds: float, seed: int) -> None:
    """Dial each of these ranks' new listener with probability ``odds`` (seeded: the same
    listeners in both runs) the moment it appears, with every number below ``size``."""
    rng = random.Random(seed)
    chosen = [pid for pid in pids if rng.random() < odds]
    deadline = time.monotonic() + 3.0
    dialled: set[int] = set()
    while len(dialled) < len(chosen) and time.monotonic() < deadline:
        for pid in chosen:
            if pid in dialled:
                continue
            with contextlib.suppress(OSError):  # a listener gone meanwhile
                for host, port in strays.listeners(pid) - before[pid]:
                    strays.dial(host, port, range(size))
                    dialled.add(pid)
        time.sleep(0.0005)


def _formations(
    count: int, tries: int, odds: float, timeout: float, race: bool
) -> list[tuple[bool, str]]:
    """``count`` formations on this rank: (formed, what it wrote on stderr) for each."""
    import torch
    import torch.distributed as dist

    from disttrain.comm import forming, world

    rank, size = dist.get_rank(), dist.get_world_size()
    pids: list[int] = [0] * size
    dist.all_gather_object(pids, os.getpid())
    # the formations meet in a store of their own: a failed one leaves no group to meet in
    sync = dist.FileStore(os.environ[world.STORE_FILE_ENV] + ".bench", size)
    forming.TRIES = tries
    out = []
    for i in range(count):
        with contextlib.suppress(Exception):
            world.shutdown()
        _barrier(sync, f"left/{i}", size)
        before = {pid: strays.listeners(pid) for pid in pids}
        _barrier(sync, f"seen/{i}", size)
        if rank == 0 and race:
            threading.Thread(target=_stray, args=(pids, before, size, odds, i), daemon=True).start()
        elif rank == 0:
            _stray(pids[1:], before, size, odds, i)  # before its own part: no peer connects yet
        # each formation on a store file of its own, on every rank alike (a failed init
        # does not count a generation, a formed one does)
        world._generation = i + 1
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                world.init(timeout=timeout)
            total = torch.tensor([float(rank)])
            dist.all_reduce(total)
            formed = total.item() == size * (size - 1) / 2
        except Exception as exc:
            formed = False
            err.write(f"failed: {forming.summary(exc)}\n")
        out.append((formed, err.getvalue()))
    return out


def _barrier(store: object, key: str, size: int) -> None:
    store.add(key, 1)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while int(store.add(key, 0)) < size:  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise TimeoutError(key)
        time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--formations", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--odds", type=float, default=0.2, help="chance a listener is dialled")
    parser.add_argument("--timeout", type=float, default=5.0, help="each formation's timeout")
    parser.add_argument("--race", action="store_true", help="dial while the peers connect")
    args = parser.parse_args()
    from disttrain.launch.spawn import run_world

    for tries in (1, 3):
        limit = args.formations * (5 * args.timeout + 10)
        got = run_world(
            _formations,
            args.ranks,
            args=(args.formations, tries, args.odds, args.timeout, args.race),
            timeout=limit,
        )
        failed = sum(
            not all(got[r][i][0] for r in range(args.ranks)) for i in range(args.formations)
        )
        lines = [x for r in range(args.ranks) for _, e in got[r] for x in e.splitlines()]
        again = [x for x in lines if "forming the group again" in x]
        retries = (
            f"{len(again)} retry lines ({sum('(try 3 of' in x for x in again)} of them a third try)"
        )
        print(
            f"tries={tries}: {failed}/{args.formations} formations failed, "
            f"{retries}; ranks {args.ranks}, odds {args.odds}, race {args.race}",
            flush=True,
        )
        for line in sorted({x for x in lines if x.startswith("failed")})[:5]:
            print("   ", line)


if __name__ == "__main__":
    main()
