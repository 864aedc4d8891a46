"""Cohorts (Open MPI): workers of one host that join the pool together have their ranks declared
on one node and share memory; a later joiner, and a worker its nanny restarted, sit alone on their
own nodes (Open MPI 5.0.x shares memory only among ranks that initialised together: see
docs/design/scaling.md section 6), so tcp+mpi:// copies their large frames out of the other
worker's memory instead of MPI while their in-process jobs still run; after every worker restarted, the new ones form a cohort again; a
cohort member that dies before initialising does not break the others; and a worker of another
user than the sidecar's joins the pool too (its client is registered as its own user)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

from dask_pmix import SidecarPlugin, run_mpi, wait_for_plugin
from dask_pmix.rest import SidecarClient

from .conftest import IMPL, start_cluster
from .test_inprocess import last_job, wait_pool_ready, workers_of

pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="the in-process pool is Open MPI's")


NOBODY = 65534
MiB = 1 << 20


def node_view(comm, nbytes=0):
    """What Open MPI itself says of the members: who shares a node with this rank
    (MPI_Comm_split_type SHARED), and a ring exchange of `nbytes` checked on arrival."""
    from mpi4py import MPI

    from dask_pmix import pool

    shared = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        shared_size = shared.Get_size()
    finally:
        shared.Free()
    ok = True
    if nbytes:
        send = np.full(nbytes, comm.rank % 251, dtype=np.uint8)
        recv = np.empty(nbytes, dtype=np.uint8)
        comm.Sendrecv(send, dest=(comm.rank + 1) % comm.size, recvbuf=recv, source=(comm.rank - 1) % comm.size)
        ok = bool((recv == (comm.rank - 1) % comm.size % 251).all())
    p = pool.current()
    return {"shared": shared_size, "ok": ok, "local_peers": list(p.local_peers), "pool_rank": p.rank, "uid": os.getuid()}


def seats(sidecar) -> dict:
    return {w["id"]: w["pool"] for w in sidecar.workers() if w.get("pool")}


def test_a_cohort_shares_memory_with_nothing_but_open_mpis_shared_memory_transport():
    # Only the self and sm transports: a communicator over the members can carry data only if
    # Open MPI put them on one node and moves bytes through shared memory.
    only_sm = ["--ompi-env", "OMPI_MCA_btl=self,sm", "--ompi-env", "OMPI_MCA_pml=ob1",
               "--ompi-env", "OMPI_MCA_mpi_yield_when_idle=1", "--pool-cohort", "1"]  # given args override the config's
    cluster, client, sidecar = start_cluster(4, sidecar_args=only_sm)
    try:
        wait_pool_ready(sidecar, 4)
        cohort = sorted(s["rank"] for s in seats(sidecar).values())
        assert all(sorted(s["localPeers"]) == cohort for s in seats(sidecar).values()), seats(sidecar)
        results = run_mpi(client, node_view, 16 * MiB, workers=workers_of(client))
        assert [r["shared"] for r in results] == [4] * 4
        assert all(r["ok"] for r in results)
        assert all(sorted(r["local_peers"]) == cohort for r in results)
        assert last_job(sidecar)["mode"] == "inprocess"
    finally:
        client.close()
        cluster.close()


def _path_view():
    """This worker's pool rank, the ranks Open MPI put on its node, and its comm paths so far."""
    import dask_pmix
    from dask_pmix.comm.link import current_link

    link = current_link()
    stats = dask_pmix.comm_stats()
    return {"rank": link.rank, "local": sorted(link.local_peers), "paths": stats["paths"],
            "mpi_received": stats["mpi"]["bytes_received"], "cma_received": stats["cma"]["bytes_received"]}


def _move(client, src, dst, nbytes=8 * MiB):
    x = client.submit(np.ones, nbytes, dtype="u1", workers=[src], pure=False)
    assert client.submit(lambda v: int(v.sum()), x, workers=[dst], pure=False).result(timeout=120) == nbytes


def _restart_by_nanny(client, worker):
    """Kills the worker process; its nanny starts a new one (a new worker)."""
    before = set(workers_of(client))
    try:
        client.run(os._exit, 1, workers=[worker])
    except Exception:  # noqa: BLE001 - the worker died answering
        pass
    deadline = time.monotonic() + 120
    while True:
        now = set(workers_of(client))
        if len(now) == len(before) and worker not in now:
            return (now - before).pop()
        assert time.monotonic() < deadline, (before, now)
        time.sleep(0.2)


def test_a_late_joiner_and_a_restarted_worker_copy_their_frames_and_still_run_in_process():
    cluster, client, sidecar = start_cluster(3, protocol="tcp+mpi://")
    try:
        wait_pool_ready(sidecar, 3)
        first = workers_of(client)
        cohort = sorted(s["rank"] for s in seats(sidecar).values())
        assert all(client.run(_path_view)[w]["local"] == cohort for w in first)
        # Every seat ready: the cohort's epoch is registered, so whoever comes now is a late joiner.
        cluster.scale(4)
        client.wait_for_workers(4, timeout=120)
        late = (set(workers_of(client)) - set(first)).pop()
        restarted = _restart_by_nanny(client, first[0])
        wait_pool_ready(sidecar, 4)
        stayed = first[1:]
        views = client.run(_path_view)
        for w in (late, restarted):
            assert views[w]["local"] == [views[w]["rank"]], views  # alone on its node
            _move(client, stayed[0], w)
            _move(client, w, stayed[1])
        _move(client, stayed[0], stayed[1])  # the cohort's own pair still shares memory
        views = client.run(_path_view)
        for w in (late, restarted):
            assert views[w]["paths"]["cma"] >= 2 and views[w]["paths"]["sm"] == 0 and views[w]["mpi_received"] == 0, views
            assert views[w]["cma_received"] >= 8 * MiB, views
        assert views[stayed[1]]["paths"]["sm"] >= 1 and views[stayed[1]]["mpi_received"] >= 8 * MiB, views
        # Open MPI's own view, in an in-process job over all four: only the two that initialised
        # together share a node.
        members = sorted(stayed) + [late, restarted]
        results = run_mpi(client, node_view, 4 * MiB, workers=members)
        assert [r["shared"] for r in results] == [2, 2, 1, 1], results
        assert all(r["ok"] for r in results) and last_job(sidecar)["mode"] == "inprocess"
    finally:
        client.close()
        cluster.close()


def test_after_every_worker_restarted_the_new_ones_form_a_cohort_again():
    cluster, client, sidecar = start_cluster(3, protocol="tcp+mpi://")
    try:
        wait_pool_ready(sidecar, 3)
        epoch = {s["epoch"] for s in seats(sidecar).values()}
        client.restart()
        client.wait_for_workers(3, timeout=120)
        deadline = time.monotonic() + 120
        while True:
            now = workers_of(client)
            mine = {w: s for w, s in seats(sidecar).items() if w in now}
            if len(mine) == 3 and all(s["state"] == "ready" for s in mine.values()):
                break
            assert time.monotonic() < deadline, seats(sidecar)
            time.sleep(0.2)
        assert {s["epoch"] for s in mine.values()}.isdisjoint(epoch), mine  # a new epoch
        ranks = sorted(s["rank"] for s in mine.values())
        assert all(sorted(s["localPeers"]) == ranks for s in mine.values()), mine
        results = run_mpi(client, node_view, 4 * MiB, workers=now)
        assert [r["shared"] for r in results] == [3, 3, 3] and all(r["ok"] for r in results)
        assert last_job(sidecar)["mode"] == "inprocess"
        _move(client, now[0], now[1])
        view = client.run(_path_view, workers=[now[1]])[now[1]]
        assert view["paths"]["sm"] >= 1 and view["mpi_received"] >= 8 * MiB, view
    finally:
        client.close()
        cluster.close()


def _die_instead_of_initialising():
    """Makes this worker die right after the sidecar answered its join, before MPI init."""
    from dask_pmix import pool

    def die(*args, **kwargs):
        os._exit(3)

    pool.start = die


def _die_before_asking():
    """Makes this worker die before it asks the sidecar to join the pool."""
    from dask_pmix.worker import plugin

    def die(*args, **kwargs):
        os._exit(3)

    plugin.installed_library = die


def _plugin_after(cluster, client, patch, victim):
    client.run(patch, workers=[victim])
    client.register_plugin(SidecarPlugin())
    info = wait_for_plugin(client)
    return SidecarClient(info["url"], info.get("token"))


def test_a_cohort_member_that_dies_before_asking_is_not_declared():
    cluster = LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster)
    try:
        victim = workers_of(client)[0]
        sidecar = _plugin_after(cluster, client, _die_before_asking, victim)
        # The survivors form a cohort without it; the nanny brings the victim back as a new worker.
        ready = wait_pool_ready(sidecar, 3)
        survivors = [w for w in ready if w["id"] in set(workers_of(client)) - {victim}]
        cohorts = [set(w["pool"].get("localPeers") or ()) for w in survivors]
        assert len(survivors) >= 2 and all(len(c) >= 2 and c == cohorts[0] for c in cohorts), ready
        members = workers_of(client)
        results = run_mpi(client, node_view, 1 * MiB, workers=members)
        assert all(r["ok"] for r in results) and last_job(sidecar)["mode"] == "inprocess"
    finally:
        client.close()
        cluster.close()


def test_a_cohort_member_that_dies_after_its_cohort_was_declared_leaves_the_others_in_the_pool():
    # Open MPI fails the others' init after 2 s (a declared peer never published its data), and a
    # process cannot initialise MPI again: they restart through their nannies and join again.
    cluster = LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0")
    client = Client(cluster)
    try:
        before = set(workers_of(client))
        victim = sorted(before)[0]
        sidecar = _plugin_after(cluster, client, _die_instead_of_initialising, victim)
        deadline = time.monotonic() + 180
        while True:
            now = set(workers_of(client))
            ready = {w["id"] for w in sidecar.workers() if (w.get("pool") or {}).get("state") == "ready"}
            if len(now) == 3 and now.isdisjoint(before) and now <= ready:
                break
            assert time.monotonic() < deadline, (sorted(before), sorted(now),
                                                  {w: (s["rank"], s["state"], s.get("reason")) for w, s in seats(sidecar).items()})
            time.sleep(0.5)
        # Alone, or (when every old seat was gone by the time they registered) a cohort of a new
        # epoch: either way never the failed cohort's node again.
        failed = {s["namespace"] for w, s in seats(sidecar).items() if w in before}
        assert all(seats(sidecar)[w]["namespace"] not in failed or not seats(sidecar)[w].get("localPeers") for w in now)
        results = run_mpi(client, node_view, 1 * MiB, workers=sorted(now))
        assert all(r["ok"] for r in results) and last_job(sidecar)["mode"] == "inprocess"
    finally:
        client.close()
        cluster.close()


def test_a_worker_of_another_user_joins_the_pool():
    if os.getuid() != 0:
        pytest.skip("starting a worker as another user needs root")
    cluster, client, sidecar = start_cluster(1)
    proc = None
    try:
        wait_pool_ready(sidecar, 1)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX_", "OMPI_"))}
        env.update(HOME="/tmp", DASK_TEMPORARY_DIRECTORY="/tmp", PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.Popen([sys.executable, "-m", "tests.test_cohort", str(NOBODY), str(NOBODY), cluster.scheduler_address,
                                 "--no-nanny", "--nthreads", "1", "--no-dashboard", "--memory-limit", "2GiB"],
                                env={**env, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(__file__)),
                                                                           env.get("PYTHONPATH", "")])},
                                cwd="/tmp", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        client.wait_for_workers(2, timeout=120)
        ready = wait_pool_ready(sidecar, 2)
        other = next(w for w in ready if w.get("uid") == NOBODY)
        assert other["gid"] == NOBODY
        results = run_mpi(client, node_view, 1 * MiB, workers=workers_of(client))
        assert sorted(r["uid"] for r in results) == [0, NOBODY]
        assert all(r["ok"] for r in results) and last_job(sidecar)["mode"] == "inprocess"
    finally:
        client.close()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        cluster.close()


def _worker_as(uid: int, gid: int, args: list[str]) -> None:
    """`dask worker ARGS` as another user. The interpreter here lives under a directory only root
    may enter (/root/.pyenv behind /root, mode 0700), so the process starts as root, imports what
    the worker needs (this module included: jobs call its functions), then drops to UID/GID before
    the worker starts: from then on it is that user's process, for the sidecar and Open MPI alike."""
    import mpi4py

    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = False
    mpi4py.rc.threads = True
    import distributed.cli.dask_worker as cli
    import psutil  # noqa: F401
    from mpi4py import MPI  # noqa: F401 - loaded, not initialised (the pool initialises it)

    import dask_pmix.comm  # noqa: F401
    import dask_pmix.client.run  # noqa: F401
    import dask_pmix.member.inprocess  # noqa: F401
    import dask_pmix.worker.plugin  # noqa: F401
    import tests.test_cohort  # noqa: F401 - what a job's function is pickled as

    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    sys.argv = ["dask-worker", *args]
    cli.main()


if __name__ == "__main__":
    _worker_as(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
