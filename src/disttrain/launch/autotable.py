"""``--algorithm auto``: the launcher chooses the per-size table before any worker starts.

The calibrated cost model (:func:`disttrain.costing.allreduce_table`, on this machine's
cached calibration, :func:`disttrain.calibration.current`) picks an algorithm for each
message size; the table reaches every worker as ``--allreduce-table`` (a worker only looks
sizes up: it never imports the cost model). Without a calibration file of this machine
the reference machine's shipped constants choose (:func:`disttrain.calibration.reference`),
and the line says so. The launchers of a multi-node job each choose, with
the shipped reference constants, so that every node picks the same table. A table given
by hand (``--allreduce-table``) is kept. On ``--device cuda`` every size goes to ``native``
(NCCL's own tuner picks ring or tree; the model is calibrated for CPU ranks, and only
``native`` is proven with NCCL: docs/gpu.md), and so they do in a job whose workers may
leave or join (``--min-workers``, ``--max-workers``: the table is chosen for one world, and
the backend's group is the one re-formed with its members) and in one of one rank a host
(the network's constants are not known here); the line says so.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

__all__ = ["OWN_TABLE", "choose"]

#: auto's table on ``--device cuda`` and with live membership: the backend's own, every size
OWN_TABLE = "*:native"


def choose(cfg: Any, argv: list[str]) -> tuple[Any, list[str]]:
    """``cfg`` and the workers' ``argv`` with auto's table if this run reads one, else as given."""
    from disttrain import calibration, collectives, config, costing, strategies
    from disttrain.collectives.auto import AutoConfig

    tc = cfg.train
    if not collectives.chooses(tc.algorithm) or cfg.get("allreduce_table"):
        return cfg, argv
    if "algorithm" not in strategies.get(tc.strategy).settings.reads(cfg):
        return cfg, argv
    if tc.device == "cuda":
        table, why = OWN_TABLE, "on cuda: the backend's own (the model is fitted to CPU ranks)"
    elif tc.live_shrink or tc.live_grow:
        table, why = OWN_TABLE, "workers may leave or join: the backend's own, re-formed with them"
    elif tc.nnodes > 1 and tc.workers == 1:
        # every link a network link, which no constants here describe (the reference's are
        # a loopback): on 4 emulated hosts at 1 Gbit their pick ran 1.37x native's time at
        # 1 MB (butterfly) and 1.09x at 16 MB (paired; RESULTS A10)
        table, why = OWN_TABLE, "one rank a host: the backend's own (no network calibration)"
    else:
        hosts = max(1, tc.nnodes)
        cal = calibration.for_choosing(hosts)
        table = costing.allreduce_table(tc.world_size, hosts, cal)
        why = f"the cost model, {cal.source}"
    if tc.progress:
        sys.stderr.write(f"disttrain: --algorithm auto: {table} ({why})\n")
    auto = dataclasses.replace(cfg.section(AutoConfig), allreduce_table=table)
    chosen = config.RunConfig({**cfg.sections, AutoConfig: auto}, cfg.given)
    return chosen, [*argv, "--allreduce-table", table]
