"""distributed's comm contract as checks that take an address, for the tcp+mpi scheme.

distributed keeps its own checks (check_client_server, check_comm_closed_implicit, ...) in
distributed/comm/tests/test_comms.py, which its wheels and sdists leave out. upstream_checks()
loads them when they can be had (a source install of distributed, or DASK_PMIX_DISTRIBUTED_SRC
naming a checkout of it); the checks below state the same contract in our own words, so that a
clean checkout tests it too. Run as a script (under an MPI launcher, or in a pool rank) it runs
them all and prints one JSON line: {"results": {name: "ok" | error}, "stats": comm_stats()}.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import time

from distributed.comm import CommClosedError, connect, listen, parse_address
from distributed.protocol import Serialized, deserialize, serialize, to_serialize

HOST = "127.0.0.1"


def scheme_addr(scheme: str, host: str = HOST) -> str:
    return f"{scheme}://{host}"


async def comm_pair(addr, **kwargs):
    """(connector's comm, listener's comm) of one connection."""
    accepted: asyncio.Queue = asyncio.Queue()

    async def handler(comm):
        await accepted.put(comm)

    listener = await listen(addr, handler, **kwargs)
    a = await connect(listener.contact_address, **kwargs)
    b = await asyncio.wait_for(accepted.get(), 30)
    listener.stop()
    return a, b


async def client_server(addr):
    """Ping-pong with 1 then 20 concurrent clients; the scheme survives every address; unknown
    listen/connect keyword arguments are ignored."""
    scheme = parse_address(addr)[0]

    async def handler(comm):
        try:
            assert parse_address(comm.peer_address)[0] == scheme
            msg = await comm.read()
            assert msg["op"] == "ping"
            await comm.write({"op": "pong", "data": msg["data"]})
            assert (await comm.read())["op"] == "done"
        finally:
            await comm.close()

    listener = await listen(addr, handler, xxx="ignored")
    try:
        assert parse_address(listener.listen_address)[0] == scheme
        assert parse_address(listener.contact_address)[0] == scheme
        seen = []

        async def client(key, delay=0.0):
            comm = await connect(listener.contact_address, xxx="ignored")
            try:
                assert comm.peer_address == listener.contact_address
                await comm.write({"op": "ping", "data": key})
                await comm.write({"op": "done"})
                await asyncio.sleep(delay)
                assert await comm.read() == {"op": "pong", "data": key}
                seen.append(key)
            finally:
                await comm.close()

        await client(-1)
        await asyncio.gather(*(client(i, 0.05) for i in range(20)))
        assert sorted(seen) == list(range(-1, 20))
    finally:
        listener.stop()


async def comm_closed_implicit(addr):
    """A comm whose peer closed raises CommClosedError on write-then-read and on read."""
    async def handler(comm):
        await comm.close()

    async with listen(addr, handler) as listener:
        comm = await connect(listener.contact_address)
        try:
            await comm.write({})
            await comm.read()
        except CommClosedError:
            pass
        else:
            raise AssertionError("no CommClosedError after the peer closed")
        comm = await connect(listener.contact_address)
        await _raises_closed(comm.read())


async def _raises_closed(aw):
    try:
        await aw
    except CommClosedError:
        return
    raise AssertionError("expected CommClosedError")


async def comm_closed_explicit(addr):
    """Closing one end fails the reads pending on both ends, and later reads and writes."""
    a, b = await comm_pair(addr)
    a_read = asyncio.ensure_future(a.read())
    b_read = asyncio.ensure_future(b.read())
    await asyncio.sleep(0)
    await a.close()
    await _raises_closed(a_read)
    await _raises_closed(b_read)
    await _raises_closed(a.read())
    await _raises_closed(b.read())
    await _raises_closed(a.write({}))
    await _raises_closed(b.write({}))
    await b.close()


async def connect_timeout(addr):
    """Nobody listening: connect() gives up with an OSError after its timeout, not long after."""
    host_only = addr.rstrip("/")
    t0 = time.monotonic()
    try:
        await connect(f"{host_only}:44444", timeout=0.15)
    except OSError:
        pass
    else:
        raise AssertionError("connected to nobody")
    dt = time.monotonic() - t0
    assert 0.1 <= dt <= 1, dt


async def many_listeners(addr):
    """100 listeners in one process, with distinct listen and contact addresses."""
    async def handler(comm):
        pass

    listeners = [await listen(addr, handler) for _ in range(100)]
    try:
        assert len({li.listen_address for li in listeners}) == 100
        assert len({li.contact_address for li in listeners}) == 100
    finally:
        for li in listeners:
            li.stop()


def _deserialize_messages():
    big = os.urandom(1 << 20) * 8   # 8 MiB, a frame of its own (over MPI when routed)
    return [
        ({"op": "update", "x": b"abc", "to_ser": [to_serialize(123)], "ser": Serialized(*serialize(456))},
         b"abc", 123, 456),
        ({"op": "update", "x": big, "to_ser": (to_serialize(big),), "ser": Serialized(*serialize(big))},
         big, big, big),
    ]


def _check_received(out, flag, x, to_ser, ser):
    assert out["op"] == "update" and out["x"] == x
    got_to_ser = out["to_ser"]
    assert len(got_to_ser) == 1
    if flag:
        assert got_to_ser[0] == to_ser or bytes(got_to_ser[0]) == to_ser
        assert out["ser"] == ser or bytes(out["ser"]) == ser
    else:
        assert isinstance(out["ser"], Serialized)
        assert deserialize(out["ser"].header, out["ser"].frames) == ser
        item = got_to_ser[0]
        if isinstance(item, Serialized):
            assert deserialize(item.header, item.frames) == to_ser
        else:
            assert item == to_serialize(to_ser)


async def deserialize_flag(addr):
    """deserialize= on listen() and on connect() decides whether Serialized payloads arrive
    deserialized or as Serialized, for small and for large (separate-frame) payloads."""
    for msg, x, to_ser, ser in _deserialize_messages():
        for flag in (False, True):
            got: asyncio.Queue = asyncio.Queue()

            async def reader(comm):
                try:
                    await got.put(await comm.read())
                except Exception as exc:
                    await got.put(exc)
                finally:
                    await comm.close()

            async with listen(addr, reader, deserialize=flag) as listener:
                comm = await connect(listener.contact_address)
            await comm.write(msg)
            out = await asyncio.wait_for(got.get(), 60)
            if isinstance(out, Exception):
                raise out
            _check_received(out, flag, x, to_ser, ser)
            await comm.close()

            release = asyncio.Event()

            async def writer(comm):
                try:
                    await comm.write(msg)
                    await release.wait()
                finally:
                    await comm.close()

            async with listen(addr, writer) as listener:
                comm = await connect(listener.contact_address, deserialize=flag)
            try:
                out = await comm.read()
                release.set()
            finally:
                await comm.close()
            _check_received(out, flag, x, to_ser, ser)


async def deserialize_roundtrip(addr):
    """A message read with deserialize off can be written on as it is."""
    big = os.urandom(1 << 20) * 4
    msg = {"op": "update", "x": big, "to_ser": [to_serialize(big)], "ser": Serialized(*serialize(big))}
    for flag in (True, False):
        a, b = await comm_pair(addr, deserialize=flag)
        await a.write(msg)
        await b.write(await b.read())
        got = await a.read()
        assert sorted(got) == sorted(msg) and got["op"] == "update" and got["x"] == big
        if flag:
            assert isinstance(got["to_ser"][0], (bytes, bytearray)) and isinstance(got["ser"], (bytes, bytearray))
        else:
            assert isinstance(got["to_ser"][0], (to_serialize, Serialized)) and isinstance(got["ser"], Serialized)
        await a.close()
        await b.close()


def _raise_eof():
    raise EOFError


class EOFOnLoad:
    def __reduce__(self):
        return _raise_eof, ()


async def deserialize_eoferror(addr):
    """EOFError while deserialising closes the comm: the reader gets CommClosedError."""
    async def handler(comm):
        await comm.write({"data": to_serialize(EOFOnLoad())})
        await _raises_closed(comm.read())

    async with listen(addr, handler) as listener:
        comm = await connect(listener.contact_address)
        await _raises_closed(comm.read())


async def repr_and_addresses(addr):
    """repr says "closed" only once closed; each end's peer address is the other's local one."""
    a, b = await comm_pair(addr)
    assert a.peer_address == b.local_address and b.peer_address == a.local_address
    assert "closed" not in repr(a) and "closed" not in repr(b)
    assert a.local_address in repr(b) and b.local_address in repr(a)
    await a.close()
    assert "closed" in repr(a) and a.local_address in repr(a) and b.local_address in repr(a)
    await b.close()
    assert "closed" in repr(b) and a.local_address in repr(b)


CHECKS = {
    "client_server": client_server,
    "comm_closed_implicit": comm_closed_implicit,
    "comm_closed_explicit": comm_closed_explicit,
    "connect_timeout": connect_timeout,
    "many_listeners": many_listeners,
    "deserialize": deserialize_flag,
    "deserialize_roundtrip": deserialize_roundtrip,
    "deserialize_eoferror": deserialize_eoferror,
    "repr_and_addresses": repr_and_addresses,
}


def upstream_checks():
    """distributed's own check_* helpers for an address, or None when its tests are not here."""
    try:
        from distributed.comm.tests import test_comms as mod
    except ImportError:
        src = os.environ.get("DASK_PMIX_DISTRIBUTED_SRC")
        path = os.path.join(src or "", "distributed", "comm", "tests", "test_comms.py")
        if not src or not os.path.exists(path):
            return None
        import distributed.utils_test as utils_test
        certs = os.path.join(src, "distributed", "tests")
        utils_test.get_cert = lambda name: os.path.join(certs, name)  # its TLS fixtures live in the checkout
        spec = importlib.util.spec_from_file_location("distributed_upstream_test_comms", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)

    async def repr_and_addresses(addr):
        a, b = await mod.get_comm_pair(addr)
        await mod.check_addresses(a, b)  # aborts both
        a, b = await mod.get_comm_pair(addr)
        assert a.local_address in repr(b) and b.local_address in repr(a)
        await mod.check_repr(a, b)

    async def client_server(addr):
        host = parse_address(addr)[1]
        await mod.check_client_server(addr, mod.tcp_eq(host), mod.tcp_eq(host))

    return {
        "client_server": client_server,
        "comm_closed_implicit": mod.check_comm_closed_implicit,
        "comm_closed_explicit": mod.check_comm_closed_explicit,
        "connect_timeout": lambda addr: mod.check_connect_timeout(addr.rstrip("/") + ":44444"),
        "many_listeners": mod.check_many_listeners,
        "deserialize": mod.check_deserialize,
        "deserialize_roundtrip": mod.check_deserialize_roundtrip,
        "deserialize_eoferror": mod.check_deserialize_eoferror,
        "repr_and_addresses": repr_and_addresses,
    }


async def run_all(addr: str, checks: dict, timeout: float = 120) -> dict:
    results = {}
    for name, check in checks.items():
        try:
            await asyncio.wait_for(check(addr), timeout)
            results[name] = "ok"
        except BaseException as exc:  # report every check, not only the first failure
            results[name] = f"{type(exc).__name__}: {exc}"
    return results


PAIR_PAYLOAD = 8 << 20       # bytes of each large echo: frames of their own, over MPI when routed
PAIR_CONNECTIONS = 4         # concurrent connections of the connector, sharing one pair communicator


async def _echo_server(addr: str, addr_file: str, timeout: float) -> dict:
    """Rank 0 of a two-rank launcher world: listens, publishes its contact address in addr_file,
    echoes every message until the connector says stop."""
    stop = asyncio.Event()
    echoed = 0

    async def handler(comm):
        nonlocal echoed
        try:
            while True:
                msg = await comm.read()
                if msg.get("op") == "stop":
                    stop.set()
                    return
                await comm.write(msg)
                echoed += 1
        except CommClosedError:
            pass
        finally:
            await comm.close()

    async with listen(addr, handler) as listener:
        tmp = addr_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(listener.contact_address)
        os.replace(tmp, addr_file)
        await asyncio.wait_for(stop.wait(), timeout)
    return {"echoed": echoed}


async def _echo_client(addr_file: str, timeout: float) -> dict:
    """Rank 1: connects to rank 0 (another process), checks small and large echoes on one
    connection and then on several at once, and tells rank 0 to stop."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(addr_file):
        assert time.monotonic() < deadline, "rank 0 published no address"
        await asyncio.sleep(0.05)
    with open(addr_file) as f:
        contact = f.read()
    big = os.urandom(1 << 20) * (PAIR_PAYLOAD >> 20)

    async def session(key: int) -> None:
        comm = await connect(contact)
        try:
            for i in range(10):
                await comm.write({"op": "ping", "data": (key, i)})
                assert await comm.read() == {"op": "ping", "data": (key, i)}
            await comm.write({"op": "big", "x": to_serialize(big)})
            got = await comm.read()
            assert got["op"] == "big" and bytes(got["x"]) == big, "large echo differs"
        finally:
            await comm.close()

    await session(-1)
    await asyncio.gather(*(session(k) for k in range(PAIR_CONNECTIONS)))
    comm = await connect(contact)
    await comm.write({"op": "stop"})
    await comm.close()
    return {"sessions": PAIR_CONNECTIONS + 1}


async def slow_pair(addr: str) -> None:
    """A pair communicator that is not built within PAIR_WAIT: the connection carries its frames in
    the TCP stream (and keeps the contract), the build goes on, and once the communicator exists the
    idle connection says it is closed, so that its next one (Dask's pool opens it) runs over MPI."""
    import numpy as np
    from distributed.comm import connect, listen
    from distributed.protocol import to_serialize

    from dask_pmix.comm import hello, pairs

    pairs._registries.clear()   # forget the pair communicator the checks built: the next is new
    wait, hello.PAIR_WAIT = hello.PAIR_WAIT, 0.0
    got = []

    async def handler(comm):
        got.append((comm.transport, (await comm.read())["x"].nbytes))
        await comm.write("ok")
        await comm.close()

    listener = await listen(addr, handler)
    try:
        payload = {"x": to_serialize(np.ones(4 << 20, dtype="u1"))}
        first = await connect(listener.contact_address)
        assert first.transport == "tcp", first.transport
        await first.write(payload)
        assert await first.read() == "ok"
        hello.PAIR_WAIT = wait
        deadline = time.monotonic() + 30
        while not first.closed():   # the revisit: due once the communicator exists and the comm is idle
            assert time.monotonic() < deadline, "the connection never asked to be renegotiated"
            await asyncio.sleep(0.2)
        second = await connect(listener.contact_address)
        assert second.transport == "mpi", second.transport
        await second.write(payload)
        assert await second.read() == "ok"
        await second.close()
        assert got == [("tcp", 4 << 20), ("mpi", 4 << 20)], got
    finally:
        hello.PAIR_WAIT = wait
        listener.stop()


def main_pair(link_world, addr_file: str, timeout: float = 120) -> dict:
    """Two ranks, two processes: the connection runs over a pair communicator between them."""
    addr = scheme_addr("tcp+mpi")
    if link_world.rank == 0:
        return asyncio.run(asyncio.wait_for(_echo_server(addr, addr_file, timeout), timeout + 10))
    return asyncio.run(asyncio.wait_for(_echo_client(addr_file, timeout), timeout + 10))


def main() -> None:
    """Under an MPI launcher: join its world, run our checks (and distributed's, when here).
    With DASK_PMIX_CONTRACT_PAIR naming a file, two ranks instead run an echo between them."""
    from dask_pmix.comm import comm_stats, link

    world = link.join_launcher_world()
    pair_file = os.environ.get("DASK_PMIX_CONTRACT_PAIR")
    if pair_file:
        link.set_link(world)
        out: dict = {"rank": world.rank}
        try:
            out.update(main_pair(world, pair_file))
            out["ok"] = True
        except BaseException as exc:
            out["ok"] = False
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["stats"] = comm_stats()
        print("RESULT " + json.dumps(out), flush=True)
        link.leave_launcher_world(world)
        return
    link.set_link(world)
    addr = scheme_addr("tcp+mpi")
    out = {"results": asyncio.run(run_all(addr, CHECKS))}
    upstream = upstream_checks()
    if upstream is not None:
        out["upstream"] = asyncio.run(run_all(addr, upstream))
    out["stats"] = comm_stats()
    from dask_pmix.comm import engine

    eng = engine._engine
    before = eng.polls if eng else 0
    time.sleep(1.0)  # every connection is closed: the progress thread must not wake at all
    out["idle_polls_per_s"] = (eng.polls if eng else 0) - before
    out["engine_in_flight"] = eng.in_flight() if eng else 0
    out["posted_now"] = eng.posted_now if eng else 0
    out["slow_pair"] = asyncio.run(run_all(addr, {"slow_pair": slow_pair}))["slow_pair"]
    print("RESULT " + json.dumps(out), flush=True)
    link.leave_launcher_world(world)


if __name__ == "__main__":
    main()
