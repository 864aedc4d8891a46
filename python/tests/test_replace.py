"""Replacing a worker twice in quick succession: a LocalCluster closes the nanny of a worker whose
name is away at its lost-worker check, lost-worker-timeout after each removal (distributed's
SpecCluster), which is where a second replacement's restart puts it. The replacer waits that long
after a name's last removal before restarting it, so the worker comes back both times."""

from __future__ import annotations

import time

import dask
import pytest
from distributed import Client, LocalCluster, wait

from dask_pmix import SidecarPlugin, wait_for_plugin

LOST_WORKER_TIMEOUT = 8.0


def _replace(client: Client, worker: str) -> dict:
    async def replace(dask_scheduler, worker: str):
        return await dask_scheduler.plugins["dask-pmix"].replace_worker(worker, "a test asks for it")

    return client.run_on_scheduler(replace, worker=worker)


def _address_of(client: Client, name) -> str | None:
    found = [a for a, w in client.scheduler_info()["workers"].items() if w["name"] == name]
    return found[0] if found else None


def _replaced(client: Client) -> list[dict]:
    return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.plugins["dask-pmix"].replacer.replaced)


def _wait_for(what, condition, within: float):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} within {within} s")


def test_a_worker_replaced_twice_in_quick_succession_comes_back_both_times():
    with dask.config.set({"distributed.deploy.lost-worker-timeout": f"{LOST_WORKER_TIMEOUT}s"}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        try:
            client.register_plugin(SidecarPlugin(pool=False))
            wait_for_plugin(client)
            name = client.scheduler_info()["workers"][_address_of(client, 0)]["name"]
            first = _address_of(client, name)
            assert _replace(client, first) == {"replacing": first}
            _wait_for("the first replacement's worker left", lambda: _address_of(client, name) != first, 60)
            removed_at = time.monotonic()
            second = _wait_for("the first replacement's worker came back", lambda: _address_of(client, name), 60)
            assert second != first
            # The second replacement is asked for just before the cluster's lost-worker check of the
            # first removal, so that a restart made at once would have the worker away at that check.
            time.sleep(max(0.0, removed_at + LOST_WORKER_TIMEOUT - 0.6 - time.monotonic()))
            assert time.monotonic() < removed_at + LOST_WORKER_TIMEOUT, "the worker came back too late to test"
            assert _replace(client, second) == {"replacing": second}
            third = _wait_for(
                "the second replacement's worker came back",
                lambda: (a := _address_of(client, name)) not in (None, second) and a,
                LOST_WORKER_TIMEOUT + 60,
            )
            # It stays: the cluster's check of the second removal finds it there.
            time.sleep(LOST_WORKER_TIMEOUT + 1)
            assert _address_of(client, name) == third
            assert len(client.scheduler_info()["workers"]) == 2
            assert name in cluster.workers, "the cluster closed the replaced worker's nanny"
            outcomes = [r["outcome"] for r in _replaced(client)]
            assert outcomes == ["data moved, restarted"] * 2, outcomes
        finally:
            client.close()
            cluster.close()


@pytest.mark.parametrize("amm", [True, False], ids=["memory-manager", "no-memory-manager"])
def test_a_worker_whose_data_cannot_move_is_kept_serving_dask(monkeypatch, amm):
    # A value that cannot be pickled (an in-process rank's result may be a lock) never gets a copy
    # elsewhere: Dask's retirement would retry it for good, the worker taking no task meanwhile.
    # Without the cluster's memory manager, retire_workers runs one of its own.
    from dask_pmix.scheduler import replace

    monkeypatch.setattr(replace, "RETIRE_STALL", 3.0)  # the scheduler runs in this process
    with dask.config.set({"distributed.scheduler.active-memory-manager.start": amm}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    try:
        client.register_plugin(SidecarPlugin(pool=False))
        wait_for_plugin(client)
        worker = _address_of(client, 0)
        lock = client.submit(lambda: __import__("threading").Lock(), workers=[worker], pure=False)
        data = client.submit(lambda: list(range(1000)), workers=[worker], pure=False)
        wait([lock, data], timeout=30)
        assert client.who_has([lock, data]) == {lock.key: (worker,), data.key: (worker,)}
        t0 = time.monotonic()
        assert _replace(client, worker) == {"replacing": worker}
        outcome = _wait_for("the replacement's outcome", lambda: _replaced(client), 30)[0]["outcome"]
        took = time.monotonic() - t0
        # (the other value may not move either: a worker fetches a peer's keys in one batch)
        assert outcome.startswith("kept: its data could not be moved: ") and "could not be copied" in outcome, outcome
        assert took < 3.0 + 10, took
        # Still there, under the same address, taking tasks, with both values.
        assert client.scheduler_info()["workers"][worker]["status"] == "running"
        assert client.submit(lambda x: len(x), data, workers=[worker], pure=False).result(timeout=10) == 1000
        assert worker in client.who_has([lock])[lock.key]
        assert client.submit(lambda: 1, workers=[worker], pure=False).result(timeout=10) == 1
        print(f"kept after {took:.1f} s: {outcome}")
    finally:
        client.close()
        cluster.close()


def test_with_a_lost_worker_timeout_of_days_a_second_replacement_is_not_held_back():
    # The cluster's check of the name is days ahead: the restarted worker is back long before
    # it, so the replacer does not wait for it (it used to wait the whole timeout).
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "7 days"}):
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
        try:
            client.register_plugin(SidecarPlugin(pool=False))
            wait_for_plugin(client)
            name = client.scheduler_info()["workers"][_address_of(client, 0)]["name"]
            first = _address_of(client, name)
            assert _replace(client, first) == {"replacing": first}
            second = _wait_for(
                "the first replacement's worker came back",
                lambda: (a := _address_of(client, name)) not in (None, first) and a,
                60,
            )
            t0 = time.monotonic()
            assert _replace(client, second) == {"replacing": second}
            _wait_for(
                "the second replacement's worker came back",
                lambda: _address_of(client, name) not in (None, second),
                60,
            )
            took = time.monotonic() - t0
            outcomes = _wait_for("both outcomes", lambda: len(_replaced(client)) == 2 and _replaced(client), 10)
            assert [r["outcome"] for r in outcomes] == ["data moved, restarted"] * 2, outcomes
            print(f"the second replacement was back {took:.1f} s after it was asked for")
        finally:
            client.close()
            cluster.close()
