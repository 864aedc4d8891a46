"""A Dask cluster over two "hosts": network namespaces on a bridge, each running two worker
processes (listening on tcp+mpi://), with the scheduler (and its embedded sidecar) on the
bridge's own address. run_mpi then spans hosts: ranks reach the sidecar over the bridge and share
memory only within a host; and the workers' own traffic moves over MPI between the two workers of
a host and stays in the TCP stream between hosts. Needs root and iproute2; skipped where network
namespaces cannot be made."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from dask_pmix import SidecarPlugin, run_mpi, wait_for_plugin

from .conftest import IMPL

TAG = f"dq{os.getpid() % 100000}"
SUBNET = f"10.{150 + os.getpid() % 50}.9"
SERVER_IP = f"{SUBNET}.1"
BRIDGE = f"br-{TAG}"
HOSTS = [(f"{TAG}a", f"{SUBNET}.2"), (f"{TAG}b", f"{SUBNET}.3")]
BIN = os.path.dirname(sys.executable)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def make_network() -> bool:
    if shutil.which("ip") is None:
        return False
    try:
        ip("link", "add", BRIDGE, "type", "bridge")
    except subprocess.CalledProcessError:
        return False
    ip("addr", "add", f"{SERVER_IP}/24", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")
    for i, (ns, addr) in enumerate(HOSTS):
        veth = f"v{TAG}{i}"
        ip("netns", "add", ns)
        ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", veth, "master", BRIDGE)
        ip("link", "set", veth, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", "eth0")
        ip("netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
    return True


def remove_network() -> None:
    for ns, _ in HOSTS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def wait_workers(client, n: int, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(client.scheduler_info()['workers'])} of {n} workers joined")
        time.sleep(0.2)
    return sorted(client.scheduler_info()["workers"])


@pytest.fixture(scope="module")
def two_hosts():
    if not make_network():
        pytest.skip("network namespaces cannot be made here")
    procs = []
    try:
        port = 18000 + os.getpid() % 1000
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PMIX", "OMPI_", "PMI_"))}
        procs.append(subprocess.Popen([f"{BIN}/dask", "scheduler", "--host", SERVER_IP, "--port", str(port),
                                       "--no-dashboard"], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        for ns, addr in HOSTS:
            procs.append(subprocess.Popen(["ip", "netns", "exec", ns, f"{BIN}/dask", "worker",
                                           f"tcp://{SERVER_IP}:{port}", "--host", addr, "--nworkers", "2",
                                           "--nthreads", "1", "--no-dashboard", "--protocol", "tcp+mpi"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        client = Client(f"tcp://{SERVER_IP}:{port}", timeout=30)
        workers = wait_workers(client, 4)
        client.register_plugin(SidecarPlugin())
        wait_for_plugin(client)
        yield client, workers
        client.close()
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        remove_network()


def test_run_mpi_spans_hosts_and_shares_memory_within_each(two_hosts):
    # Fork mode: each rank is registered on its worker's real host. (In-process ranks each sit on
    # a node of their own in the pool, so they share memory with nobody: see the next test.)
    client, workers = two_hosts

    def locality(comm):  # defined here: the workers cannot import this test module
        from mpi4py import MPI

        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        out = {"rank": comm.rank, "local_size": local.size, "sum": comm.allreduce(comm.rank + 1)}
        local.Free()
        return out

    results = run_mpi(client, locality, workers=workers, impl=IMPL, mode="fork")
    assert [r["local_size"] for r in results] == [2, 2, 2, 2]
    assert [r["sum"] for r in results] == [10, 10, 10, 10]
    # and again, on a subset that takes one worker from each host
    by_host = {}
    for w in workers:
        by_host.setdefault(w.split("//")[1].rsplit(":", 1)[0], []).append(w)
    subset = [ws[0] for ws in by_host.values()]
    results = run_mpi(client, locality, workers=subset, impl=IMPL, mode="fork")
    assert [r["local_size"] for r in results] == [1, 1]


def pool_ready(client, workers):
    """The sidecar, once every worker's pool session is up."""
    from dask_pmix.rest import SidecarClient

    info = wait_for_plugin(client)
    sidecar = SidecarClient(info["url"], info.get("token"))
    deadline = time.monotonic() + 120
    while sum((w.get("pool") or {}).get("state") == "ready" for w in sidecar.workers()) < len(workers):
        assert time.monotonic() < deadline, [w.get("pool") for w in sidecar.workers()]
        time.sleep(0.2)
    return sidecar


def host_of(worker: str) -> str:
    return worker.split("//")[1].rsplit(":", 1)[0]


def test_in_process_jobs_span_hosts(two_hosts):
    # The workers' own processes, each with its session in the pool (over the bridge), run the job.
    client, workers = two_hosts
    if IMPL != "openmpi":
        pytest.skip("the in-process pool is Open MPI's")
    sidecar = pool_ready(client, workers)

    def where(comm):
        return {"pid": os.getpid(), "sum": comm.allreduce(comm.rank + 1)}

    pids = client.run(os.getpid)
    for _ in range(3):
        results = run_mpi(client, where, workers=workers)
        assert [r["sum"] for r in results] == [10] * 4
        assert [r["pid"] for r in results] == [pids[w] for w in workers]
    job = max(sidecar.jobs(), key=lambda j: j["createdAt"])
    assert job["mode"] == "inprocess"


def test_each_pair_of_workers_chooses_its_path_within_and_across_hosts(two_hosts):
    """tcp+mpi://: the two workers of a host joined the pool together, so Open MPI put them on one
    node (a cohort per host) and their large frames go over MPI's shared memory; a pair on two
    hosts would reach each other over Open MPI's TCP transport, slower than the TCP stream, so
    their frames stay in the stream (no pair communicator)."""
    import numpy as np

    import dask_pmix

    client, workers = two_hosts
    if IMPL != "openmpi":
        pytest.skip("the in-process pool is Open MPI's")
    pool_ready(client, workers)

    def _link():  # defined here: the workers cannot import this test module
        from dask_pmix.comm.link import current_link

        link = current_link()
        return None if link is None else {"rank": link.rank, "local": sorted(link.local_peers)}

    deadline = time.monotonic() + 60
    while None in (links := client.run(_link)).values():
        assert time.monotonic() < deadline, links
        time.sleep(0.2)
    for w in workers:
        mates = [v for v in workers if host_of(v) == host_of(w)]
        assert links[w]["local"] == sorted(links[v]["rank"] for v in mates), links
    before = client.run(dask_pmix.comm_stats)
    size = 8 << 20
    for a in workers:
        for b in workers:
            if a != b:
                x = client.submit(np.ones, size, dtype="u1", workers=[a], pure=False)
                assert client.submit(lambda v: int(v.sum()), x, workers=[b], pure=False).result(timeout=60) == size
                del x
    after = client.run(dask_pmix.comm_stats)
    for w in workers:
        got = {t: after[w][t]["bytes_received"] - before[w][t]["bytes_received"] for t in ("mpi", "tcp")}
        # from the one worker of its host over MPI, from the two of the other host in the stream
        assert size <= got["mpi"] < 2 * size, (w, got, after[w])
        assert got["tcp"] >= 2 * size, (w, got, after[w])
        paths = after[w]["paths"]
        assert paths["sm"] >= 1 and paths["tcp"] >= 2 and paths["fabric"] == 0, (w, paths)
