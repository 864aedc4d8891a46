"""A pair communicator's construction cancelled when its connection dies before the listener
commits (comm/hello.py, comm/pairs.py), between two real workers of a cohort (the sm path).

The connector starts building the pair's communicator as it sends its choice; the listener builds
its side once it has read that choice. The connection between them runs through a TCP relay in
this process that lets the transport negotiation through and then breaks the connection at one
of its messages, as a failing network or a peer's closing socket would:

- at the connector's choice, which never reaches the listener: the listener never builds, so the
  connector's construction would wait in MPI for ever, holding the activation gate and its pair
  token. It is cancelled: the gate and the token are let go at once, the pair is not marked
  broken, and the next connection of the two workers builds a communicator and moves data over
  MPI; an in-process job over both runs.
- at the listener's answer that it committed: both sides build, the connector gave up on it
  meanwhile, and the communicator is kept for the pair (no leak, nothing held)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

import numpy as np
import pytest

import dask_pmix

from .test_comm_cluster import _local_peers, _wait_in_pool, start

IMPL = os.environ.get("DASK_PMIX_TEST_IMPL", "openmpi")
pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="the in-process pool is Open MPI only")

HEAD = struct.Struct("<4sI")  # hello.py's framing: b"DPMX", a length, msgpack


class BreakingRelay:
    """Relays one TCP connection to `upstream` and breaks it (both sides closed) when the
    `side` ("connector" or "listener") is about to pass on its `nth` negotiation message."""

    def __init__(self, upstream: tuple[str, int], side: str, nth: int):
        self.upstream, self.side, self.nth = upstream, side, nth
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "%s:%d" % self.server.getsockname()
        self.broken = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        down, _ = self.server.accept()
        up = socket.create_connection(self.upstream)
        self.server.close()
        threading.Thread(target=self._pump, args=(down, up, self.side == "connector"), daemon=True).start()
        threading.Thread(target=self._pump, args=(up, down, self.side == "listener"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, breaking: bool) -> None:
        seen = 0
        try:
            while True:
                head = _recv_exact(src, HEAD.size)
                magic, n = HEAD.unpack(head)
                assert magic == b"DPMX", magic
                body = _recv_exact(src, n)
                seen += 1
                if breaking and seen == self.nth:
                    self.broken.set()
                    for s in (src, dst):
                        s.shutdown(socket.SHUT_RDWR)
                        s.close()
                    return
                dst.sendall(head + body)
        except (OSError, ConnectionError):
            for s in (src, dst):
                s.close()


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


async def _connect_once(address: str, dask_worker=None):
    """One tcp+mpi connection attempt to `address` (no retries); how it ended, and the activation
    gate and the pair registry afterwards, once the cancelled construction had a moment."""
    import asyncio

    from distributed.comm.registry import get_backend

    from dask_pmix.comm.link import current_link
    from dask_pmix.comm.pairs import registry_for
    from dask_pmix.worker.activation import GATE

    try:
        comm = await get_backend("tcp+mpi").get_connector().connect(address)
        comm.abort()
        outcome = "connected"
    except Exception as exc:  # noqa: BLE001
        outcome = f"{type(exc).__name__}: {exc}"
    deadline = time.monotonic() + 10
    while (GATE.busy() or GATE._pairs) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    reg = registry_for(current_link())
    return {"outcome": outcome, "gate_busy": GATE.busy(), "pair_tokens": len(GATE._pairs),
            "names": {peer: reg.names(peer) for peer in reg._pairs}, "broken": sorted(reg._broken)}


def _gate():
    from dask_pmix.worker.activation import GATE

    return {"gate_busy": GATE.busy(), "pair_tokens": len(GATE._pairs)}


@pytest.fixture
def pair():
    cluster, client = start("tcp+mpi://", n=2)
    peers = client.run(_local_peers)
    assert all(len(p) == 2 for p in peers.values()), peers  # a cohort: the pair chooses sm
    a, b = sorted(client.scheduler_info()["workers"])
    yield client, a, b, _wait_in_pool(client, 2)
    client.close()
    cluster.close()


def _relay_to(worker: str, side: str, nth: int) -> BreakingRelay:
    host, port = worker.split("://")[1].rsplit(":", 1)
    return BreakingRelay((host, int(port)), side, nth)


def test_a_build_whose_connection_dies_before_the_listener_commits_is_cancelled(pair):
    client, a, b, ranks = pair
    relay = _relay_to(b, "connector", 2)  # the connector's choice never reaches B
    got = client.run(_connect_once, relay.address, workers=[a])[a]
    assert relay.broken.is_set()
    assert got["outcome"] != "connected", got
    # Nothing waits for the construction any more: the gate and the pair token are free, on both.
    assert not got["gate_busy"] and got["pair_tokens"] == 0, got
    assert client.run(_gate) == {a: {"gate_busy": False, "pair_tokens": 0}, b: {"gate_busy": False, "pair_tokens": 0}}
    assert got["names"].get(ranks[b]) == [] and got["broken"] == [], got  # cancelled, the pair not broken
    stats = client.run(dask_pmix.comm_stats)
    assert stats[a]["events"].get("pair_comm_cancelled") == 1, stats[a]["events"]
    assert "pair_comms" not in stats[a]["events"] and "pair_comms" not in stats[b]["events"], stats

    # The two workers' next connection builds a pair communicator and moves Dask data over MPI.
    x = client.submit(np.ones, 16 << 20, dtype="u1", workers=[a], pure=False)
    assert client.submit(lambda v: int(v.sum()), x, workers=[b], pure=False).result(timeout=120) == 16 << 20
    after = client.run(dask_pmix.comm_stats)
    assert after[b]["mpi"]["bytes_received"] >= 16 << 20, after[b]
    assert after[a]["events"].get("pair_comms") == 1 and after[b]["events"].get("pair_comms") == 1, after
    # and an in-process job over both finds nothing of the cancelled construction in its way
    from dask_pmix import run_mpi

    assert run_mpi(client, lambda comm: comm.allreduce(1), workers=[a, b], mode="inprocess") == [2, 2]
    assert client.run(_gate) == {a: {"gate_busy": False, "pair_tokens": 0}, b: {"gate_busy": False, "pair_tokens": 0}}


def test_a_build_whose_commit_is_lost_keeps_the_communicator_both_built(pair):
    client, a, b, ranks = pair
    relay = _relay_to(b, "listener", 2)  # B commits and builds; its answer never reaches A
    got = client.run(_connect_once, relay.address, workers=[a])[a]
    assert relay.broken.is_set()
    assert got["outcome"] != "connected", got
    assert not got["gate_busy"] and got["pair_tokens"] == 0, got
    deadline = time.monotonic() + 30
    while True:
        stats = client.run(dask_pmix.comm_stats)
        if stats[a]["events"].get("pair_comms") == 1 and stats[b]["events"].get("pair_comms") == 1:
            break
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
    assert stats[a]["events"].get("pair_comm_cancelled") == 1, stats[a]["events"]
    # The construction both sides completed is the pair's: the next connection uses it.
    x = client.submit(np.ones, 16 << 20, dtype="u1", workers=[a], pure=False)
    assert client.submit(lambda v: int(v.sum()), x, workers=[b], pure=False).result(timeout=120) == 16 << 20
    after = client.run(dask_pmix.comm_stats)
    assert after[b]["mpi"]["bytes_received"] >= 16 << 20, after[b]
    assert after[a]["events"].get("pair_comms") == 1 and after[b]["events"].get("pair_comms") == 1, after
    assert client.run(_gate) == {a: {"gate_busy": False, "pair_tokens": 0}, b: {"gate_busy": False, "pair_tokens": 0}}
