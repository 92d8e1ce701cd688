"""The meter under threads: a pause leaves out every thread's sends except those in
``counting()``, whose tally is exactly that thread's; concurrent records lose nothing."""

from __future__ import annotations

import threading

from disttrain.comm.meter import Meter


def test_pause_leaves_out_other_threads_but_not_a_counting_block() -> None:
    m = Meter()
    with m.paused():
        m.record(1, 100)  # the paused thread's own send: left out
        seen: list[int] = []

        def sender() -> None:
            m.record(1, 7)  # another thread, not counting: left out too (ZeRO-3's eval gather)
            with m.counting() as tally:
                m.record(1, 30)
                m.record(2, 12, messages=2)
            seen.append(tally.bytes_sent)

        t = threading.Thread(target=sender)
        t.start()
        t.join()
    assert seen == [42]
    assert m.bytes_sent == 42 and m.messages_sent == 3
    assert m.snapshot().per_peer_bytes == {1: 30, 2: 12}


def test_a_tally_holds_its_own_thread_only_and_nothing_is_lost() -> None:
    m = Meter()
    tallies: list[int] = []

    def sender(nbytes: int) -> None:
        with m.counting() as tally:
            for _ in range(20_000):
                m.record(0, nbytes)
        tallies.append(tally.bytes_sent)

    threads = [threading.Thread(target=sender, args=(k,)) for k in (1, 3)]
    for t in threads:
        t.start()
    for _ in range(20_000):
        m.record(0, 5)  # the training thread sends meanwhile: in no tally
    for t in threads:
        t.join()
    assert sorted(tallies) == [20_000, 60_000]
    assert m.bytes_sent == 20_000 * (1 + 3 + 5)


def test_a_helper_thread_sending_on_behalf_counts_in_the_callers_tally() -> None:
    # the hierarchical allreduce's network part runs on its own thread: what it sends is
    # the caller's traffic (a streaming DiLoCo fragment counts its bytes in a tally)
    m = Meter()
    with m.paused(), m.counting() as tally:
        work = m.on_behalf(lambda: m.record(1, 100))
        helper = threading.Thread(target=work)
        helper.start()
        helper.join()
        other = threading.Thread(target=m.record, args=(1, 7))  # not on behalf: paused
        other.start()
        other.join()
    assert (tally.bytes_sent, tally.messages_sent) == (100, 1)
    assert m.bytes_sent == 100
