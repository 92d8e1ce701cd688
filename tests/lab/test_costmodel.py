"""The cost model: cost() reproduced, closed forms, ranking flips, fits that recover constants."""

from __future__ import annotations

import math
import re

import pytest

from disttrain import collectives, costing
from disttrain.collectives.paths import critical_path
from disttrain.lab import costmodel
from disttrain.lab.calibration import Calibration, fit_compute, fit_link, nonneg_relative_lstsq

ALGS = [a for a in collectives.ALGORITHMS]
CAL = Calibration.defaults()


@pytest.mark.parametrize("algorithm", ALGS)
@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9])
@pytest.mark.parametrize("nbytes", [4, 4096, 1000 * 4, 12345 * 4])
def test_bytes_and_messages_are_each_algorithms_cost(algorithm: str, n: int, nbytes: int) -> None:
    algo = collectives.get(algorithm)
    costs = [algo.cost(nbytes, n, r, 4) for r in range(n)]
    path = critical_path(algorithm, nbytes, n, 4)
    assert path.bytes_per_rank == max(c.bytes_sent for c in costs)
    assert path.messages_per_rank == max(c.messages for c in costs)
    assert path.total_bytes == sum(c.bytes_sent for c in costs)
    assert path.total_messages == sum(c.messages for c in costs)


def test_ring_closed_form() -> None:
    # T = 2(n-1)·α + 2(n-1)/n·S·β, for S divisible by n
    alpha, beta, n, s = 7e-6, 1 / 3e9, 8, 8 * 1024 * 4
    t, path = costmodel.allreduce_seconds("ring", s, n, costmodel.Network(alpha, beta, 0.0), CAL)
    assert path.steps == 2 * (n - 1)
    assert t == pytest.approx(2 * (n - 1) * alpha + 2 * (n - 1) / n * s * beta, rel=1e-12)


@pytest.mark.parametrize(
    ("algorithm", "n", "steps", "bytes_in_s"),
    [
        ("butterfly", 8, 3, 3.0),  # log2(n) whole arrays
        ("butterfly", 6, 4, 4.0),  # log2(4) + a fold step at each end
        ("halving_doubling", 8, 6, 2 * 7 / 8),  # 2·log2(n) steps, 2(n-1)/n·S
        ("halving_doubling", 5, 6, 2 * 3 / 4 + 2),  # p = 4, + S each way to the folded pair
        ("tree", 7, 4, 8.0),  # 2·log2(n) levels, 2S through a parent per level
        ("tree", 2, 2, 2.0),  # one child: S up, S down
        ("star", 5, 5, 8.0),  # 2(n-1)·S through the root, n messages
        ("alltoall", 5, 4, 4.0),  # (n-1)·S from every rank
        ("roundrobin", 4, 6, 1.5),
    ],
)
def test_closed_forms_by_hand(algorithm: str, n: int, steps: int, bytes_in_s: float) -> None:
    s = 960 * 4  # divisible by every n used
    path = critical_path(algorithm, s, n, 4)
    assert path.steps == steps
    assert path.critical_bytes == pytest.approx(bytes_in_s * s)
    assert path.seconds(1.0, 0.0, 0.0) == steps
    assert path.seconds(0.0, 2.0, 0.0) == pytest.approx(2 * bytes_in_s * s)


def _time(alg: str, nbytes: int, n: int, net: costmodel.Network) -> float:
    return costmodel.allreduce_seconds(alg, nbytes, n, net, CAL)[0]


def test_small_messages_on_high_latency_favour_few_steps() -> None:
    net = costmodel.Network(alpha=50e-6, beta=1 / 10e9, gamma=0.0)
    ring = _time("ring", 4096, 64, net)
    assert _time("butterfly", 4096, 64, net) < ring
    assert _time("tree", 4096, 64, net) < ring
    assert _time("halving_doubling", 4096, 64, net) < ring


def test_large_messages_favour_bandwidth_optimal() -> None:
    net = costmodel.Network(alpha=5e-6, beta=1 / 1e9, gamma=1 / 10e9)
    s = 256 << 20
    for fast in ("ring", "halving_doubling"):
        for slow in ("butterfly", "tree", "star", "alltoall"):
            assert _time(fast, s, 64, net) < _time(slow, s, 64, net), (fast, slow)


def test_star_degrades_with_n() -> None:
    net = costmodel.Network(alpha=5e-6, beta=1 / 1e9, gamma=0.0)
    ratios = [_time("star", 1 << 20, n, net) / _time("ring", 1 << 20, n, net) for n in (2, 8, 64)]
    assert ratios[0] < ratios[1] < ratios[2]


def test_fusion_buckets_set_latency_terms() -> None:
    net = costmodel.Network(alpha=1e-3, beta=0.0, gamma=0.0)
    cal = Calibration(seconds_per_flop=0.0, seconds_per_param=0.0)
    work = costmodel.Workload(params=4 << 20, batch_size=64)  # 16 MB of gradients
    one = costmodel.predict("allreduce:ring", work, 4, net, cal)
    many = costmodel.predict(
        "allreduce:ring",
        costmodel.Workload(params=4 << 20, batch_size=64, bucket_bytes=1 << 20),
        4,
        net,
        cal,
    )
    assert one.comm_seconds == pytest.approx(4 * 6 * 1e-3)  # 4 MB buckets: 4 x 2(n-1) steps
    assert many.comm_seconds == pytest.approx(16 * 6 * 1e-3)
    assert costmodel.bucket_sizes(10, 4) == [4, 4, 2]
    assert costmodel.bucket_sizes(10, 0) == [10]


def test_strategies_relate_as_their_definitions() -> None:
    net = costmodel.Network(alpha=5e-6, beta=8 / 10e9)
    work = costmodel.Workload(params=10_000_000, batch_size=64 * 16, bucket_bytes=0)
    ring = costmodel.predict("allreduce:ring", work, 16, net, CAL)
    local = costmodel.predict("localsgd:8:algorithm=ring", work, 16, net, CAL)
    assert local.comm_seconds == pytest.approx(ring.comm_seconds / 8)
    assert local.compute_seconds == ring.compute_seconds
    one_server = costmodel.predict("ps:sync", work, 16, net, CAL)
    many = costmodel.predict(
        "ps:sync",
        costmodel.Workload(params=10_000_000, batch_size=64 * 16, servers=16),
        16,
        net,
        CAL,
    )
    assert many.comm_seconds < one_server.comm_seconds
    assert costmodel.predict("ps:async", work, 16, net, CAL).step_seconds <= one_server.step_seconds
    everyone = costmodel.predict("decentralized:onebit:density=0.01", work, 1000, net, CAL)
    gossip = costmodel.predict(
        "decentralized:onebit:density=0.01:topology=ring", work, 1000, net, CAL
    )
    assert gossip.comm_seconds < everyone.comm_seconds
    assert costmodel.compressed_bytes(1_000_000, 0.01) < 1_000_000 * 4 // 32


def test_efficiency_is_one_on_one_node_and_falls_with_comm() -> None:
    net = costmodel.Network(alpha=5e-6, beta=8 / 1e9)
    work = costmodel.Workload(params=25_000_000, batch_size=32)
    assert costmodel.predict("allreduce:ring", work, 1, net, CAL).efficiency == 1.0
    big = costmodel.Workload(params=25_000_000, batch_size=32 * 64)
    assert costmodel.predict("allreduce:ring", big, 64, net, CAL).efficiency < 1.0


def test_ten_thousand_nodes() -> None:
    net = costmodel.Network(alpha=5e-6, beta=8 / 25e9)
    work = costmodel.Workload(params=25_000_000, batch_size=32 * 10_000)
    preds = costmodel.rank(costmodel.DEFAULT_STRATEGIES, work, 10_000, net, CAL)
    assert len(preds) == len(costmodel.DEFAULT_STRATEGIES)
    assert all(math.isfinite(p.step_seconds) and p.step_seconds > 0 for p in preds)
    assert [p.step_seconds for p in preds] == sorted(p.step_seconds for p in preds)
    ring = next(p for p in preds if p.strategy == "allreduce:ring")
    assert ring.reason.startswith("latency-bound")  # 2·9,999 steps per bucket at 5 us


def test_unknown_strategy_is_a_value_error() -> None:
    work = costmodel.Workload(params=10, batch_size=1)
    net = costmodel.Network(1e-6, 1e-9)
    for bad in ("allreduce:nope", "gossip", "localsgd:0", "decentralized:2"):
        with pytest.raises(ValueError):
            costmodel.predict(bad, work, 2, net, CAL)


def test_fit_recovers_alpha_beta_gamma() -> None:
    alpha, beta, gamma = 37e-6, 1 / 2.5e9, 1 / 7e9
    rows, times = [], []
    for i, alg in enumerate(ALGS):
        for n in (2, 3, 4, 8):
            for s in (4096, 1 << 16, 1 << 20, 1 << 24):
                p = critical_path(alg, s, n, 4)
                noise = 1 + 0.002 * ((i + n + s) % 3 - 1)  # ±0.2 %, deterministic
                rows.append((p.steps, p.critical_bytes, p.reduced_bytes))
                times.append(p.seconds(alpha, beta, gamma) * noise)
    a, b, g = fit_link(rows, times)
    assert a == pytest.approx(alpha, rel=0.01)
    assert b == pytest.approx(beta, rel=0.01)
    assert g == pytest.approx(gamma, rel=0.01)


def test_fit_compute_recovers_rates() -> None:
    params, flops = 1_000_000, 6e6
    s_flop, s_param = 1 / 30e9, 4e-9
    points = [(b, b * flops * s_flop + params * s_param) for b in (8.0, 32.0, 128.0)]
    got = fit_compute(points, params, flops)
    assert got[0] == pytest.approx(s_flop, rel=0.01)
    assert got[1] == pytest.approx(s_param, rel=0.01)


def test_nonneg_fit_never_returns_negative() -> None:
    # t grows with the first feature only; an unconstrained fit would make x2 negative
    x = nonneg_relative_lstsq([[1, 5], [2, 1], [3, 9], [4, 0]], [1.0, 2.1, 2.9, 4.2])
    assert all(v >= 0 for v in x)
    with pytest.raises(ValueError):
        nonneg_relative_lstsq([[1.0]], [0.0])


def test_calibration_round_trip(tmp_path: pytest.TempPathFactory) -> None:
    path = str(tmp_path / "sub" / "cal.json")  # type: ignore[operator]
    cal = Calibration(alpha=1e-5, loopback={"2": [1e-5, 2e-6, 1e-9]}, colocation={"2": 1.4})
    cal.save(path)
    back = Calibration.load(path)
    assert back == cal
    assert back.loopback_link(3) == (1e-5, 2e-6, 1e-9)  # the closest fitted
    assert back.colocation_factor(2) == 1.4
    assert Calibration(cores=2).colocation_factor(4) == 2.0
    with open(path, "w") as fh:
        fh.write('{"alpha": -1}')
    with pytest.raises(ValueError, match="alpha"):
        Calibration.load(path)
    with open(path, "w") as fh:
        fh.write('{"nonsense": 1}')
    with pytest.raises(ValueError, match="unknown keys"):
        Calibration.load(path)


def test_shared_host_fit_recovers_its_constants() -> None:
    from disttrain.lab.calibrate import STAT, fit_shared_link

    alpha, delta, beta = 120e-6, 30e-6, 1 / 2e9
    rows = []
    for alg in ALGS:
        for s in (4096, 1 << 16, 1 << 20, 8 << 20):
            p = critical_path(alg, s, 4, 4)
            rows.append({"algorithm": alg, "size": s, STAT: p.shared_seconds(alpha, delta, beta)})
    a, d, b = fit_shared_link(rows, 4)
    assert (a, d, b) == pytest.approx((alpha, delta, beta), rel=0.01)
    net = costmodel.Network(alpha=a, beta=b, delta=d, shared_host=True)
    t, p = costmodel.allreduce_seconds("ring", 1 << 20, 4, net, CAL)
    assert t == pytest.approx(p.steps * a + p.total_messages * d + p.total_bytes * b)


def test_shared_memory_barriers_and_copies_get_their_own_fitted_constants() -> None:
    import dataclasses

    from disttrain.lab.bench.allreduce import parse_size
    from disttrain.lab.calibrate import (
        SHARED_MEMORY_SIZES,
        STAT,
        fit_shm_link,
        shared_memory_algorithms,
    )

    barrier, inner, mu = 150e-6, 40e-6, 1 / 20e9
    rows = []
    assert shared_memory_algorithms() == ["shm"]  # one_host and not composite
    for text in SHARED_MEMORY_SIZES:
        p = critical_path("shm", parse_size(text), 3, 4)
        wakeups = p.steps - p.inner_steps
        rows.append(
            {
                "algorithm": "shm",
                "size": parse_size(text),
                STAT: wakeups * barrier + p.inner_steps * inner + p.total_copied * mu,
            }
        )
        # the bench's native anchor copies nothing through shared memory: not fitted
        rows.append({"algorithm": "native", "size": parse_size(text), STAT: 1.0})
    fitted = fit_shm_link(rows, 3)
    assert fitted == pytest.approx([barrier, inner, mu], rel=0.01)
    cal = dataclasses.replace(CAL, shared_memory={"3": fitted})
    net = costmodel.Network(alpha=20e-6, beta=1 / 2e9, delta=30e-6, shared_host=True)
    t, p = costmodel.allreduce_seconds("shm", 3 << 20, 3, net, cal)  # a size not fitted
    assert p.total_copied > 0 and p.inner_steps == 4 and p.steps == 6  # 3 pieces of 1 MiB
    assert t == pytest.approx(4 * inner + 2 * barrier + p.total_copied * mu)
    assert t == pytest.approx(p.shared_seconds(barrier, net.delta, net.beta, mu, inner))
    # a calibration written before the inner barriers' constant: priced as the others
    old = dataclasses.replace(CAL, shared_memory={"3": [barrier, mu]})
    assert old.shm_link(3) == (barrier, barrier, mu)
    # uncalibrated, or an algorithm that copies nothing: loopback's α and the one-thread μ
    t0, _ = costmodel.allreduce_seconds("shm", 3 << 20, 3, net, CAL)
    assert t0 == pytest.approx(p.shared_seconds(net.alpha, net.delta, net.beta, CAL.mu))
    assert t0 == pytest.approx(p.steps * net.alpha + p.total_copied * CAL.mu)
    ring, q = costmodel.allreduce_seconds("ring", 1 << 20, 3, net, cal)
    assert ring == pytest.approx(q.shared_seconds(net.alpha, net.delta, net.beta, cal.mu))
    assert cal.shm_link(4) == tuple(fitted)  # the closest fitted rank count


def test_codec_time_has_a_dense_and_a_per_sent_entry_term() -> None:
    # coding = P·e + K·e_s + peers·(P·d + K·d_s), K = P·density; no link cost here
    cal = Calibration(
        seconds_per_encode=3e-9,
        seconds_per_decode=2e-9,
        seconds_per_encode_sent=5e-7,
        seconds_per_decode_sent=4e-7,
    )
    net = costmodel.Network(alpha=0.0, beta=0.0)
    work = costmodel.Workload(params=1_000_000, batch_size=64)
    for density in (0.0004, 0.01):
        p = costmodel.predict(f"decentralized:onebit:density={density}", work, 4, net, cal)
        sent = 1_000_000 * density
        expected = 1e6 * 3e-9 + sent * 5e-7 + 3 * (1e6 * 2e-9 + sent * 4e-7)
        assert p.comm_seconds == pytest.approx(expected, rel=1e-9)


def test_one_grammar_with_compare() -> None:
    """advise's specs are compare's: the main setting, key=value, a compressor's default."""
    from disttrain.comm.errors import UsageError
    from disttrain.strategies.spec import parse_one

    net = costmodel.Network(alpha=0.0, beta=1e-9, gamma=0.0)
    work = costmodel.Workload(params=1_000_000, batch_size=64)
    topk = costmodel.predict("decentralized:topk:0.01", work, 4, net, CAL)
    # top-k at density 0.01: exp-Golomb gaps and an fp32 value per sent entry, to 3 peers
    assert topk.bytes_per_rank == 3 * costmodel.compressed_bytes(1_000_000, 0.01, 32)
    onebit = costmodel.predict("decentralized:onebit:density=0.01", work, 4, net, CAL)
    assert onebit.bytes_per_rank == 3 * costmodel.compressed_bytes(1_000_000, 0.01, 1)
    assert "assumes 0.01" in onebit.note
    with pytest.raises(
        ValueError, match=re.escape("density=0.01")
    ):  # τ does not give one-bit's share
        costmodel.predict("decentralized:onebit", work, 4, net, CAL)
    with pytest.raises(ValueError, match="RATIO"):
        costmodel.predict("decentralized:topk:0.01:density=0.1", work, 4, net, CAL)
    with pytest.raises(UsageError, match="only `disttrain advise` reads it"):
        parse_one("decentralized:onebit:density=0.01")  # compare trains: no assumptions
    # a spec's settings override the workload's for its row
    ps = costmodel.predict("ps:sync", work, 4, net, CAL)
    assert costmodel.predict("ps:sync:servers=4", work, 4, net, CAL).comm_seconds < (
        ps.comm_seconds
    )
    one = costmodel.predict("allreduce:ring:fusion-mb=0", work, 4, net, CAL)
    many = costmodel.predict("allreduce:ring:fusion-mb=1", work, 4, net, CAL)
    assert one.messages_per_rank * 4 == many.messages_per_rank  # 4 MB: one bucket vs four
    with pytest.raises(ValueError, match="does not read lr"):
        costmodel.predict("allreduce:ring:lr=0.5", work, 4, net, CAL)
    for strategy in ("tensor", "hybrid"):
        with pytest.raises(ValueError, match=f"{strategy} is not modelled: "):
            costmodel.predict(strategy, work, 4, net, CAL)


def test_default_rows_come_from_the_strategies() -> None:
    rows = costmodel.default_strategies()
    # not native (modelled as ring), not a one-host algorithm (shm: asked for by name), not a
    # chooser (auto: the fastest row by construction, asked for by name)
    algorithms = [
        a
        for a, x in collectives.ALGORITHMS.items()
        if a not in ("native", "auto") and not x.one_host
    ]
    assert [r for r in rows if r.startswith("allreduce:")] == [f"allreduce:{a}" for a in algorithms]
    assert {"ps:sync", "ps:async", "localsgd:8", "localsgd:32"} <= set(rows)
    assert not [r for r in rows if r.split(":")[0] in ("tensor", "hybrid")]
    assert [r for r in rows if r.startswith("pipeline:")] == [
        "pipeline:1f1b",
        "pipeline:interleaved:virtual_stages=2",
        "pipeline:zb1",
        "pipeline:zb2",
    ]


def test_per_step_framework_work_is_added_to_every_step_and_old_files_load(
    tmp_path: pytest.TempPathFactory,
) -> None:
    from disttrain.costing import Workload, compute_seconds

    work = Workload(params=1000, batch_size=64, ranks_per_host=2)
    base = Calibration(cores=1, colocation={"2": 1.5})
    with_step = Calibration(cores=1, colocation={"2": 1.5}, seconds_per_step=0.002)
    # the fixed work runs on the shared cores too: slowed by the same colocation factor
    assert compute_seconds(work, 2, with_step) == pytest.approx(
        compute_seconds(work, 2, base) + 0.002 * 1.5
    )
    path = str(tmp_path / "old.json")  # type: ignore[operator]
    with open(path, "w") as fh:
        fh.write('{"alpha": 1e-5}')  # written before the term existed
    assert Calibration.load(path).seconds_per_step == 0.0


@pytest.mark.parametrize("strategy", ["allreduce:ring", "zero:1", "zero:2", "zero:3"])
def test_a_synchronous_steps_wait_is_charged_once_per_step_at_its_rank_count(
    strategy: str,
) -> None:
    work = costmodel.Workload(params=100_000, batch_size=64, ranks_per_host=3)
    net = costmodel.Network(alpha=1e-5, beta=1e-9, shared_host=True)
    base = Calibration(cores=2)
    synced = Calibration(cores=2, sync={"2": 0.004, "4": 0.009})
    for n, wait in [(2, 0.004), (3, 0.004), (4, 0.009), (8, 0.009)]:  # the closest measured
        plain = costmodel.predict(strategy, work, n, net, base)
        waits = costmodel.predict(strategy, work, n, net, synced)
        assert waits.step_seconds == pytest.approx(plain.step_seconds + wait, rel=1e-12)
        assert waits.compute_seconds == plain.compute_seconds
    one = costmodel.predict(strategy, work, 1, net, synced)
    assert one.step_seconds == costmodel.predict(strategy, work, 1, net, base).step_seconds


def test_powersgd_steps_wait_for_the_slowest_rank_too() -> None:
    from dataclasses import replace

    work = costmodel.Workload(params=10_100, batch_size=64, shapes=((100, 100), (100,)))
    net = costmodel.Network(alpha=1e-5, beta=1e-9)
    spec = "allreduce:ring:compression=powersgd:2"
    plain = costmodel.predict(spec, work, 4, net, Calibration(cores=2))
    waits = costmodel.predict(spec, replace(work), 4, net, Calibration(cores=2, sync={"4": 0.01}))
    assert waits.step_seconds == pytest.approx(plain.step_seconds + 0.01, rel=1e-12)


def test_the_sync_fit_is_the_measured_step_beyond_the_prediction() -> None:
    from dataclasses import replace

    from disttrain.lab import calibrate

    cal = Calibration(cores=2, colocation={"2": 1.2}, loopback={"2": [2e-5, 5e-5, 2e-10]})
    params, _ = calibrate.mlp_params()
    work = costmodel.Workload(
        params=params,
        batch_size=calibrate.CAL_BATCH * 2,
        ranks_per_host=2,
        buckets=calibrate.mlp_buckets(4.0),
    )
    predicted = costmodel.predict(
        "allreduce:native", work, 2, calibrate.loopback_network(cal, 2), cal
    ).step_seconds
    fitted = calibrate.fit_sync(cal, {2: predicted + 0.006})
    assert fitted["2"] == pytest.approx(0.006, rel=1e-9)
    # with it, the same configuration is predicted as measured; a faster step fits 0
    again = costmodel.predict(
        "allreduce:native", work, 2, calibrate.loopback_network(cal, 2), replace(cal, sync=fitted)
    ).step_seconds
    assert again == pytest.approx(predicted + 0.006, rel=1e-9)
    assert calibrate.fit_sync(cal, {2: predicted / 2})["2"] == 0.0


@pytest.mark.parametrize("spec", ["localsgd:50", "diloco:50", "allreduce"])
def test_the_fastest_algorithm_is_one_whose_path_the_network_describes(spec: str) -> None:
    # hierarchical's path follows the launch's layout ($LOCAL_WORLD_SIZE): never a choice
    work = costmodel.Workload(params=1_000_000, batch_size=256)
    net = costmodel.Network(alpha=5e-5, beta=8 / 1e9)
    p = costmodel.predict(spec, work, 8, net, CAL)
    assert p.bytes_per_rank > 0 and p.comm_seconds > 0
    assert costing.fastest_allreduce(work, 8, net, CAL) != "hierarchical"
