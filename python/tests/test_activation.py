"""The gate that keeps the comm backend's MPI progress away from communicators being built in the
same process (dask_pmix/activation.py): builders wait for running progress rounds, progress waits
for builders, builders never wait for each other."""

from __future__ import annotations

import threading
import time

from dask_pmix.worker.activation import Gate


def in_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_progress_waits_while_a_communicator_is_built():
    gate, entered = Gate(), threading.Event()

    def progress():
        with gate.progress():
            entered.set()

    with gate.building():
        t = in_thread(progress)
        assert not entered.wait(0.3), "a progress round ran while a communicator was being built"
        assert gate.busy()
    assert entered.wait(5)
    t.join(5)
    assert not gate.busy()


def test_a_builder_waits_for_the_running_progress_round_and_no_new_round_starts_before_it():
    gate, built, started = Gate(), threading.Event(), []
    release = threading.Event()

    def long_round():
        with gate.progress():
            release.wait(5)

    def builder():
        with gate.building():
            built.set()

    def later_round():
        with gate.progress():
            started.append(built.is_set())

    first = in_thread(long_round)
    time.sleep(0.1)
    b = in_thread(builder)
    assert not built.wait(0.3), "the builder did not wait for the progress round in flight"
    time.sleep(0.05)
    late = in_thread(later_round)  # arrives while the builder waits: must not overtake it
    time.sleep(0.2)
    assert started == []
    release.set()
    for t in (first, b, late):
        t.join(5)
    assert built.is_set() and started == [True]


def test_builders_do_not_wait_for_each_other():
    # A communicator is collective over processes that may each be building another: if builders
    # queued, two hosts could wait on each other for good.
    gate = Gate()
    both_in = threading.Barrier(2, timeout=5)
    errors = []

    def builder():
        try:
            with gate.building():
                both_in.wait()
        except threading.BrokenBarrierError as exc:
            errors.append(exc)

    threads = [in_thread(builder) for _ in range(2)]
    for t in threads:
        t.join(10)
    assert errors == []


def test_no_new_pair_is_agreed_on_while_a_job_runs_and_a_job_waits_for_those_agreed_on():
    gate = Gate()
    token = gate.reserve_pair()                # a pair agreed on, being built
    assert token is not None
    started = threading.Event()

    def job():
        assert gate.job_begins(5)
        started.set()

    t = in_thread(job)
    assert not started.wait(0.3), "the job built its communicator beside a pair's construction"
    gate.pair_done(token)
    assert started.wait(5)
    t.join(5)
    assert gate.reserve_pair() is None         # the job runs: this Dask connection stays TCP
    gate.job_ends()
    gate.pair_done(gate.reserve_pair())


def test_a_job_waits_a_bounded_time_for_a_pair_that_never_finishes():
    gate = Gate()
    assert gate.reserve_pair() is not None     # never done: its peer never came
    t0 = time.monotonic()
    assert gate.job_begins(0.2) is False
    assert time.monotonic() - t0 < 2
    gate.job_ends()
    t0 = time.monotonic()
    assert gate.job_begins(0.2) is False       # a stale reservation does not hold jobs up again
    assert time.monotonic() - t0 < 0.1
    gate.job_ends()


def test_a_construction_that_hangs_holds_progress_back_for_a_bounded_time_only():
    # A pair's construction that never ends (its peer never called it) must not stall every other
    # MPI transfer of the process.
    gate, entered = Gate(hold=0.3), threading.Event()
    release = threading.Event()

    def stuck_builder():
        with gate.building():
            release.wait(10)

    b = in_thread(stuck_builder)
    time.sleep(0.05)
    t0 = time.monotonic()
    with gate.progress():
        entered.set()
    assert 0.15 < time.monotonic() - t0 < 3
    release.set()
    b.join(5)


def test_an_abandoned_construction_holds_nothing_back():
    """A construction whose peer never comes (comm/pairs.py cancels it): once abandoned, progress
    runs and the gate is free, though its thread is still inside; the thread's later
    constructions count again once it has forgotten the abandonment."""
    gate, inside, leave, ran = Gate(hold=30.0), threading.Event(), threading.Event(), threading.Event()
    idents: list[int] = []

    def stuck_builder():
        idents.append(threading.get_ident())
        with gate.building():
            inside.set()
            leave.wait(10)
        gate.forget(threading.get_ident())

    t = in_thread(stuck_builder)
    assert inside.wait(5) and gate.busy()
    gate.abandon(idents[0])
    assert not gate.busy()

    def progress():
        with gate.progress():
            ran.set()

    p = in_thread(progress)
    assert ran.wait(5), "progress waited for an abandoned construction"
    p.join(5)
    leave.set()
    t.join(5)
    with gate.building():  # this thread was never abandoned
        assert gate.busy()
