"""A Dask cluster over two "hosts": network namespaces on a bridge, each running two worker
processes, with the scheduler (and its embedded sidecar) on the bridge's own address. run_mpi
then spans hosts: ranks reach the sidecar over the bridge and share memory only within a host.
Needs root and iproute2; skipped where network namespaces cannot be made."""

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
                                           "--nthreads", "1", "--no-dashboard"], env=env,
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


def test_in_process_jobs_span_hosts(two_hosts):
    # The workers' own processes, each with its session in the pool (over the bridge), run the job.
    client, workers = two_hosts
    if IMPL != "openmpi":
        pytest.skip("the in-process pool is Open MPI's")
    from dask_pmix.rest import SidecarClient

    info = wait_for_plugin(client)
    sidecar = SidecarClient(info["url"], info.get("token"))
    deadline = time.monotonic() + 120
    while sum((w.get("pool") or {}).get("state") == "ready" for w in sidecar.workers()) < len(workers):
        assert time.monotonic() < deadline, [w.get("pool") for w in sidecar.workers()]
        time.sleep(0.2)

    def where(comm):
        return {"pid": os.getpid(), "sum": comm.allreduce(comm.rank + 1)}

    pids = client.run(os.getpid)
    for _ in range(3):
        results = run_mpi(client, where, workers=workers)
        assert [r["sum"] for r in results] == [10] * 4
        assert [r["pid"] for r in results] == [pids[w] for w in workers]
    job = max(sidecar.jobs(), key=lambda j: j["createdAt"])
    assert job["mode"] == "inprocess"
