"""The gate that keeps the comm backend's MPI progress away from communicators being built in the
same process (dask_pmix/activation.py): builders wait for running progress rounds, progress waits
for builders, builders never wait for each other."""

from __future__ import annotations

import threading
import time

from dask_pmix.activation import Gate


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
