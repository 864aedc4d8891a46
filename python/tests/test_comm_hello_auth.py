"""tcp+mpi:// hellos are bound to the pool epoch's secret (issue 31, item 3): a process outside the
pool that replays a member's description, or the bytes of a member's hello, gets nothing from a
worker's listener but a TCP answer (and no pair communicator construction, tag or reservation
held for it), a member does not build a pair with a listener that cannot prove it is in the
pool, and the real pair still moves its frames over MPI afterwards.

The stranger is this test process: it speaks the negotiation (comm/hello.py) over raw sockets.
"""

from __future__ import annotations

import os
import socket
import struct
import threading

import msgpack
import numpy as np
import pytest

import dask_pmix

from .test_comm_cluster import _local_peers, _wait_in_pool, start

IMPL = os.environ.get("DASK_PMIX_TEST_IMPL", "openmpi")
pytestmark = pytest.mark.skipif(IMPL != "openmpi", reason="the in-process pool is Open MPI only")

_HEAD = struct.Struct("<4sI")
NBYTES = 32 << 20  # above comm.sm-threshold (4 MiB): the frame goes over MPI on the sm path


def _send(sock: socket.socket, body: dict) -> None:
    data = msgpack.packb(body)
    sock.sendall(_HEAD.pack(b"DPMX", len(data)) + data)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        got = sock.recv(n - len(out))
        if not got:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += got
    return out


def _recv(sock: socket.socket) -> dict:
    magic, n = _HEAD.unpack(_recv_exactly(sock, _HEAD.size))
    assert magic == b"DPMX", magic
    return msgpack.unpackb(_recv_exactly(sock, n))


def _hostport(address: str) -> tuple[str, int]:
    host, port = address.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def _description():
    from dask_pmix.comm.link import current_link
    from dask_pmix.comm.paths import describe

    return describe(current_link())


def _commitments(peer: int):
    """What this worker holds for pool rank `peer`: pair communicators built or being built,
    constructions running, tags handed out, and activation-gate reservations."""
    from dask_pmix.comm.link import current_link
    from dask_pmix.comm.pairs import registry_for
    from dask_pmix.worker.activation import GATE

    reg = registry_for(current_link())
    with reg._lock:
        return {
            "pairs": sorted(reg._pairs.get(peer, {})),
            "running": sorted(reg._running),
            "tags": reg._tags.get(peer, 0),
            "broken": reg.broken(peer),
            "reservations": len(GATE._pairs),
        }


NOTHING = {"pairs": [], "running": [], "tags": 0, "broken": False, "reservations": 0}


async def _dial(address: str, dask_worker=None) -> str:
    from distributed.comm import connect

    try:
        comm = await connect(address, timeout=3)
    except Exception as exc:  # noqa: BLE001 - the stranger's end closes or refuses
        return type(exc).__name__
    comm.abort()
    return "connected"


@pytest.fixture
def pair():
    """Two workers of one cohort (they share memory: their pair's path is sm), not connected to
    each other yet: (client, a, b, ranks)."""
    cluster, client = start("tcp+mpi://", n=2)
    peers = client.run(_local_peers)
    assert all(len(p) == 2 for p in peers.values()), peers
    a, b = sorted(client.scheduler_info()["workers"])
    yield client, a, b, _wait_in_pool(client, 2)
    client.close()
    cluster.close()


def _real_transfer_goes_over_mpi(client, a, b) -> None:
    """B reads a result held on A (B dials A's listener): over MPI, on the sm path, without a
    fallback."""
    before = client.run(dask_pmix.comm_stats)
    x = client.submit(np.ones, NBYTES, dtype="u1", workers=[a], pure=False)
    total = client.submit(lambda v: int(v.sum()), x, workers=[b], pure=False).result(timeout=120)
    assert total == NBYTES
    after = client.run(dask_pmix.comm_stats)
    sb = after[b]
    assert sb["mpi"]["bytes_received"] - before[b]["mpi"]["bytes_received"] >= NBYTES, sb
    assert sb["paths"]["sm"] > before[b]["paths"]["sm"], sb
    for w in (a, b):
        fallbacks = {k: v for k, v in after[w]["events"].items() if k.startswith("tcp_fallback:pair-")}
        assert not fallbacks, (w, after[w]["events"])


def _dialled_by(client, worker, serve) -> None:
    """`worker` dials a stranger's listener, which handles the connection with serve(conn)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)

    def accept():
        conn, _ = server.accept()
        with conn:
            conn.settimeout(10)
            serve(conn)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        client.run(_dial, f"tcp+mpi://127.0.0.1:{server.getsockname()[1]}", workers=[worker])
        t.join(30)
    finally:
        server.close()


def _capture_hello(client, b) -> bytes:
    """The bytes of the hello B sends when it dials a tcp+mpi address: what a process that could
    read B's traffic would replay."""
    got: list[bytes] = []

    def keep(conn):
        head = _recv_exactly(conn, _HEAD.size)
        got.append(head + _recv_exactly(conn, _HEAD.unpack(head)[1]))

    _dialled_by(client, b, keep)
    assert got, "B sent no hello"
    return got[0]


def test_a_forged_hello_that_replays_a_members_description_gets_a_tcp_answer(pair):
    client, a, b, ranks = pair
    desc = client.run(_description, workers=[b])[b]
    assert desc["epoch"] is not None and desc["rank"] == ranks[b] and ranks[a] in desc["local"], desc
    forged = [
        dict(desc),  # the description alone (what every hello carried before)
        {**desc, "nonce": os.urandom(16), "mac": os.urandom(32)},  # and a MAC made up
    ]
    for hello in forged:
        with socket.create_connection(_hostport(a), timeout=30) as sock:
            _send(sock, hello)
            answer = _recv(sock)
        assert answer["mpi"] is False, answer
        assert answer["why"] == "unauthenticated", answer
    # A committed to nothing for it: no pair, no construction, no tag, no reservation
    assert client.run(_commitments, ranks[b], workers=[a])[a] == NOTHING
    events = client.run(dask_pmix.comm_stats, workers=[a])[a]["events"]
    assert events.get("tcp_fallback:unauthenticated") == len(forged), events
    _real_transfer_goes_over_mpi(client, a, b)


def test_a_replayed_hello_gets_no_commitment(pair):
    """The exact bytes of B's hello (a valid MAC) replayed: A answers MPI (nothing in one message
    tells a replay apart without another round trip), but the connector's choice must answer the
    nonce of A's answer, which a replayer cannot: A starts no construction and holds nothing."""
    client, a, b, ranks = pair
    captured = _capture_hello(client, b)
    with socket.create_connection(_hostport(a), timeout=30) as sock:
        sock.sendall(captured)
        answer = _recv(sock)
        if answer.get("mpi"):
            _send(sock, {"mpi": True, "pair": f"dask-pmix-comm:forged:{ranks[a]}-{ranks[b]}:9.0", "tag": 1,
                         "mac": os.urandom(32)})
            sock.settimeout(30)
            try:
                reply = _recv(sock)
            except (EOFError, ConnectionResetError):
                reply = None
            assert reply is None, f"the listener answered a forged choice: {reply}"
    # the tag of its answer is used up (tags are never reused), nothing else
    assert client.run(_commitments, ranks[b], workers=[a])[a] == {**NOTHING, "tags": 1}
    events = client.run(dask_pmix.comm_stats, workers=[a])[a]["events"]
    assert events.get("tcp_fallback:unauthenticated") == 1, events
    _real_transfer_goes_over_mpi(client, a, b)


def test_a_member_builds_no_pair_with_a_listener_outside_the_pool(pair):
    """The other way round: a stranger listening where B dials answers MPI with A's description; B
    does not start a construction for it (it would wait for A, which never calls it)."""
    client, a, b, ranks = pair
    desc = client.run(_description, workers=[a])[a]
    seen: list[dict] = []

    def answer_as_a(conn):
        _recv(conn)
        _send(conn, {"mpi": True, "path": "sm", **desc, "pairs": [], "tag": 1, "can_build": True,
                     "nonce": os.urandom(16), "mac": os.urandom(32)})
        try:
            seen.append(_recv(conn))
        except EOFError:
            pass

    _dialled_by(client, b, answer_as_a)
    assert seen and seen[0].get("mpi") is False and seen[0].get("why") == "unauthenticated", seen
    assert client.run(_commitments, ranks[a], workers=[b])[b] == NOTHING
    _real_transfer_goes_over_mpi(client, a, b)


def _record_handler_errors(dask_worker=None):
    """Keeps, in the worker, what its loop and tornado log as errors from here on."""
    import logging

    class Keep(logging.Handler):
        def emit(self, record):
            kept.append(f"{record.name}: {record.getMessage()}")

    kept: list[str] = []
    handler = Keep(logging.ERROR)
    for name in ("tornado.application", "tornado.general", "asyncio", "distributed"):
        logging.getLogger(name).addHandler(handler)
    dask_worker._test_kept_errors = kept


def _handler_errors(dask_worker=None):
    return list(dask_worker._test_kept_errors)


def test_a_hello_with_fields_of_the_wrong_type_is_dropped_quietly(pair):
    """A hello that claims the listener's epoch with fields of the wrong type (local peers as a
    number, a rank as a list) is a broken negotiation: the listener drops the connection without
    an uncaught exception in its loop, and its pair with the real member is untouched."""
    client, a, b, ranks = pair
    desc = client.run(_description, workers=[b])[b]
    client.run(_record_handler_errors, workers=[a])
    for hello in ({**desc, "local": 5}, {**desc, "rank": [ranks[b]], "local": 5}, {**desc, "epoch": [1]}):
        with socket.create_connection(_hostport(a), timeout=30) as sock:
            _send(sock, hello)
            sock.settimeout(30)
            try:
                answer = _recv(sock)
            except (EOFError, ConnectionResetError):
                answer = None
            assert answer is None or answer.get("mpi") is False, (hello, answer)
    assert client.run(_handler_errors, workers=[a])[a] == []
    assert client.run(_commitments, ranks[b], workers=[a])[a] == NOTHING
    _real_transfer_goes_over_mpi(client, a, b)
